"""The seam a training method plugs into: :class:`Method`, the step a method module in ``trainer_service.methods``
implements (its examples, their token counts, a batch's loss), :class:`StepLoss`, what that loss gives the loop, and
the registry of steps (:data:`STEPS`, filled by :func:`method_step`).

Invariants: every step is of a method declared in :mod:`services.common.recipes` (its fields, formats and whether it
reads the reference policy come from that declaration, not from the step), and a method has one step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from trainer_service.config import TrainConfig
from trainer_service.metrics import TokenCounts
from trainer_service.policy import Policy

from services.common import recipes


@dataclass
class StepLoss:
    """What a method's :meth:`Method.loss` gives the loop: the scalar ``loss`` to minimize, the method's own
    ``metrics`` for the step's event, the step's ``tokens`` when the method counts them itself (a method that
    generates knows them only after generating; ``None``: the sum of ``method.tokens`` over the batch), and the
    ``weight`` the loss is a mean over (SFT: the batch's supervised tokens; ``None``: its examples). On several devices
    each process's loss is weighted by its share of the whole batch's weight, so the gradient is the whole batch's
    (:mod:`trainer_service.distributed`); a loss that mixes two means (ORPO's) is then weighted by examples, close to it."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    tokens: TokenCounts | None = None
    weight: float | None = None


class Method(Protocol):
    """One training method's step: how rows become examples, what an example costs and the loss of a batch.

    ``name``: its ``recipe.method``; ``spec``: its declaration (:class:`~services.common.recipes.MethodSpec`: its own
    fields, the dataset formats it trains on, whether its loss reads the reference policy, for which the loop then
    keeps one: the base with the adapter off for LoRA, a frozen copy of the starting weights for full fine-tuning,
    counted in the memory estimate). Both are set by :func:`method_step`. A ``spec.rewarded`` method's step is built
    with the job's reward function as its one argument (GRPO's ``reward``; none where only examples and token counts
    are needed, a job's estimate).
    """

    name: ClassVar[str]
    spec: ClassVar[recipes.MethodSpec]

    def examples(self, tokenizer: Any, rows: Sequence[Any], config: TrainConfig) -> list[Any]:
        """The rows as this method's examples, in order. Raises ``UntrainableRows`` naming the rows that have
        nothing left to train on after truncation at ``config.max_seq_len``."""
        ...

    def batch_rows(self, config: TrainConfig) -> int:
        """The padded batch rows one example becomes (a DPO pair: 2; a GRPO prompt: its group), for the memory estimate."""
        ...

    def tokens(self, example: Any) -> TokenCounts:
        """Tokens one step spends on ``example`` (the billed quantities; at most, for a method that generates)."""
        ...

    def loss(self, policy: Policy, batch: Sequence[Any], config: TrainConfig) -> StepLoss:
        """One optimizer step's loss on ``batch`` (see :class:`StepLoss`)."""
        ...


STEPS: dict[str, type[Method]] = {}
"""The registered steps by method name (``trainer_service.methods`` imports every module that registers one)."""

M = TypeVar("M", bound=type)


def method_step(name: str) -> Callable[[M], M]:
    """Decorator: register the decorated class as the step of the method ``name`` declared in
    :mod:`services.common.recipes`, setting its ``name`` and ``spec``. ``KeyError`` for an undeclared method,
    ``ValueError`` for a second step of one method."""
    def register(cls: M) -> M:
        if name in STEPS:
            raise ValueError(f"method {name!r} has two steps")
        cls.name, cls.spec = name, recipes.method_spec(name)
        STEPS[name] = cls
        return cls
    return register
