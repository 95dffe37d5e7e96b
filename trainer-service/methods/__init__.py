"""Training methods, one module each, registered by their ``recipe.method`` name (the seam: ``trainer_service.training.Method``;
``merge`` is a job of its own, ``merge.py``)."""

from __future__ import annotations

from trainer_service.methods.dpo import DPO
from trainer_service.methods.grpo import GRPO
from trainer_service.methods.sft import SFT
from trainer_service.training import Method

METHODS: dict[str, Method] = {m.name: m for m in (SFT(), DPO(), GRPO())}
"""Every method this trainer runs, by name (``grpo`` without its reward: a job's worker builds ``GRPO(reward)``)."""


def get_method(name: str) -> Method:
    """The method called ``name``; ``KeyError`` if this trainer has none."""
    return METHODS[name]
