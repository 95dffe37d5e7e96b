"""Wire models of the inference service's own routes (the shared ones are in ``services.common.contracts``)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from services.common.openai_protocol import ChatCompletionRequest, ModelOut


class ModelDetail(ModelOut):
    """What a model name resolves to: a served base model, or one of the run's checkpoints on its base.

    ``base_model``: the base model that serves it; ``adapter``: the checkpoint id (LoRA adapter) loaded on
    that base, ``None`` for a base model itself.
    """

    base_model: str
    adapter: str | None = None


class PromptTokensRequest(BaseModel):
    """Chat requests whose prompts to count (``POST /internal/chat/prompt-tokens``)."""

    requests: list[ChatCompletionRequest] = Field(min_length=1, max_length=128)


class PromptTokens(BaseModel):
    """Per request, in order: its prompt's tokens and the context (tokens) it would run in."""

    prompt_tokens: list[int]
    context_tokens: list[int]
