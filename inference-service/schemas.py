"""Wire models only the inference service answers with (the shared ones are in ``services.common.contracts``)."""

from __future__ import annotations

from services.common.openai_protocol import ModelOut


class ModelDetail(ModelOut):
    """What a model name resolves to: a served base model, or one of the run's checkpoints on its base.

    ``base_model``: the base model that serves it; ``adapter``: the checkpoint id (LoRA adapter) loaded on
    that base, ``None`` for a base model itself.
    """

    base_model: str
    adapter: str | None = None
