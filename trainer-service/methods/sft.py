"""``sft``: supervised fine-tuning, next-token cross-entropy on the answer tokens of ``messages`` or
``prompt_completion`` rows (the prompt carries no loss)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from trainer_service.training import Example, Policy, StepLoss, TokenCounts, TrainConfig, collate, tokenize_examples


class SFT:
    """Mean negative log-likelihood over every supervised token of the batch."""

    name: ClassVar[str] = "sft"
    formats: ClassVar[frozenset[str]] = frozenset({"messages", "prompt_completion"})
    needs_reference: ClassVar[bool] = False
    own_fields: ClassVar[frozenset[str]] = frozenset()

    def examples(self, tokenizer: Any, rows: Sequence[Any], config: TrainConfig) -> list[Example]:
        """:func:`~trainer_service.training.tokenize_examples`: loss on the answer only."""
        return tokenize_examples(tokenizer, rows, config.max_seq_len)

    def batch_rows(self, config: TrainConfig) -> int:
        """One sequence per example."""
        return 1

    def tokens(self, example: Example) -> TokenCounts:
        """The example's tokens (prompt and answer)."""
        return TokenCounts(training=len(example.input_ids))

    def loss(self, policy: Policy, batch: Sequence[Example], config: TrainConfig) -> StepLoss:
        """``-mean(log p(answer token))`` over the batch's supervised tokens; no extra metrics."""
        logprobs, _ = policy.logprobs(*collate(batch, policy.pad_token_id, policy.device.torch_device))
        return StepLoss(-logprobs.mean())
