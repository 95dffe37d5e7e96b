"""Training methods, one module each, registered by their ``recipe.method`` name (see ``base.Method``)."""

from __future__ import annotations

from trainer_service.methods.base import Method
from trainer_service.methods.dpo import DPO
from trainer_service.methods.sft import SFT

METHODS: dict[str, Method] = {m.name: m for m in (SFT(), DPO())}
"""Every method this trainer runs, by name."""


def get_method(name: str) -> Method:
    """The method called ``name``; ``KeyError`` if this trainer has none."""
    return METHODS[name]
