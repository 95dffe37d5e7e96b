"""The method seam: what a training method is to the trainer's loop (``trainer_service.training.train``).

A method is one module in this package, registered in ``trainer_service.methods.METHODS`` by its recipe name
(``recipe.method``). It says which dataset formats it trains on, turns validated rows into examples (tokenized,
cut to ``max_seq_len``), counts the tokens an example bills, and computes one step's loss from a batch of its
examples through the :class:`~trainer_service.training.Policy`. The loop does everything else alike for every
method: device, adapter (LoRA or full), optimizer, data order, checkpoints, resume, cancellation, metering.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:
    import torch
    from trainer_service.training import Policy, TrainConfig


class Method(Protocol):
    """One training method.

    ``name``: its ``recipe.method``. ``formats``: the dataset formats it trains on (``trainer_service.schemas``).
    ``needs_reference``: whether its loss reads the reference policy (the loop then keeps one: the base with the
    adapter off for LoRA, a frozen copy of the starting weights for full fine-tuning, counted in the memory estimate).
    """

    name: ClassVar[str]
    formats: ClassVar[frozenset[str]]
    needs_reference: ClassVar[bool]

    def examples(self, tokenizer: Any, rows: Sequence[Any], max_seq_len: int) -> list[Any]:
        """The rows as this method's examples, in order. Raises ``NoSupervisedTokens`` naming the rows that have
        nothing left to train on after truncation at ``max_seq_len``."""
        ...

    def tokens(self, example: Any) -> int:
        """Input tokens one step spends on ``example`` (the billed quantity)."""
        ...

    def loss(self, policy: Policy, batch: Sequence[Any], config: TrainConfig) -> tuple[torch.Tensor, dict[str, float]]:
        """``(loss, metrics)`` of one optimizer step on ``batch``: a scalar to minimize and the method's own
        metrics for the step's event (floats)."""
        ...
