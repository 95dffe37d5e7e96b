"""What training reports: :class:`TokenCounts` (the billed quantities of a step or a job), :class:`StepMetrics` (one
optimizer step, for the job's events) and :class:`TrainResult` (a run of the loop).

Token counts are the metering's: a job's hold is priced on the counts the data order gives before it runs
(:func:`~trainer_service.data_order.count_tokens`) and settled with those of the steps it took, kept across a resume in
the checkpoint's training state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class TokenCounts:
    """Tokens of a step or a job, by what they are billed as: ``training`` (input tokens of the sequences the loss
    runs forward and backward through), and for a method that generates (GRPO's rollouts) ``prefill`` (prompt tokens
    a generation computes) and ``decode`` (tokens it generates), priced as inference's are."""

    training: int = 0
    prefill: int = 0
    decode: int = 0

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(self.training + other.training, self.prefill + other.prefill, self.decode + other.decode)


@dataclass
class StepMetrics:
    """What one optimizer step did. ``tokens`` counts non-pad input tokens of the batch's training sequences (the
    billed ``training_tokens``), ``prefill_tokens``/``decode_tokens`` what its rollouts generated (GRPO; else 0);
    ``learning_rate`` is the rate used for this step; ``elapsed_s`` is wall time since this run started;
    ``extra`` holds the method's own metrics (DPO: ``reward_accuracy``, ``reward_margin``; GRPO: ``reward_mean``…)."""

    step: int
    max_steps: int
    loss: float
    learning_rate: float
    tokens: int
    tokens_per_s: float
    elapsed_s: float
    extra: dict[str, float] = field(default_factory=dict)
    prefill_tokens: int = 0
    decode_tokens: int = 0


@dataclass
class TrainResult:
    """Outcome of :func:`~trainer_service.training.train`. ``usage``: the tokens of every step (:class:`TokenCounts`),
    including steps done before a resume; ``stopped`` is true when ``should_stop`` ended training early;
    ``last_checkpoint`` is the newest ``step-<N>`` folder and ``checkpoints`` every folder this call wrote, oldest
    first (``None`` and empty when nothing is written)."""

    steps_done: int
    final_loss: float
    stopped: bool
    last_checkpoint: Path | None
    checkpoints: list[Path] = field(default_factory=list)
    usage: TokenCounts = field(default_factory=TokenCounts)
