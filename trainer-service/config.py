"""A training job's hyper-parameters: :class:`LoopConfig`, the loop's own, and :class:`TrainConfig`, those plus every
registered method's fields.

``TrainConfig`` is built from the method declarations (:mod:`services.common.recipes`), so a method's field is
declared once, there, and never restated here; its names and defaults are the recipe's (``estimate.train_config``
maps a recipe onto it). A checkpoint's ``training_state.pt`` keeps the whole config as a dict.
"""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Literal

from services.common import recipes


@dataclass
class LoopConfig:
    """The training loop's hyper-parameters; names follow PEFT's ``LoraConfig`` and transformers' ``TrainingArguments``.

    ``adapter``: ``lora`` trains a PEFT LoRA adapter (``lora_*`` on ``target_modules``) over the frozen base;
    ``full`` trains every weight. ``batch_size`` is examples per optimizer step (a DPO example is one preference
    pair). ``warmup_steps`` of linear warm-up precede the ``lr_scheduler_type`` decay (any name
    ``transformers.get_scheduler`` accepts) over ``max_steps``. Sequences longer than ``max_seq_len`` tokens are
    cut at the right. ``checkpoint_every`` is in steps; a final checkpoint is always written. ``bf16_autocast``
    takes effect on CUDA and on CPUs with native bf16 (:func:`~trainer_service.devices.cpu_has_native_bf16`).
    ``compile``: compile each decoder layer with ``torch.compile`` (regional compilation; ``None``: on CUDA only,
    where it was measured to help).
    """

    adapter: Literal["lora", "full"] = "lora"
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    target_modules: str | list[str] = "all-linear"
    learning_rate: float = 1e-3
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    batch_size: int = 16
    max_steps: int = 100
    warmup_steps: int = 10
    lr_scheduler_type: str = "cosine"
    max_seq_len: int = 256
    seed: int = 0
    checkpoint_every: int = 25
    bf16_autocast: bool = True
    compile: bool | None = None


TrainConfig = make_dataclass(  # built from the declarations, so that a method's field is never restated here
    "TrainConfig",
    [(name, info.annotation, field(default=info.default)) for method in recipes.METHODS.values() for name, info in method.config.model_fields.items()],
    bases=(LoopConfig,),
    namespace={"__module__": __name__,
               "__doc__": "A training job's hyper-parameters: :class:`LoopConfig`'s, then every registered method's own fields (``dpo_beta``, "
                          "``grpo_*``, ``orpo_lambda``: :mod:`services.common.recipes`, same names and defaults), each read only by its method."})
