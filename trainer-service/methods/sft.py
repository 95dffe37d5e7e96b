"""``sft``: supervised fine-tuning, next-token cross-entropy on the answer tokens of ``messages`` or
``prompt_completion`` rows (the prompt carries no loss)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trainer_service.config import TrainConfig
from trainer_service.examples import Example, collate, tokenize_examples
from trainer_service.metrics import TokenCounts
from trainer_service.policy import Policy
from trainer_service.steps import StepLoss, method_step


@method_step("sft")
class SFT:
    """Mean negative log-likelihood over every supervised token of the batch."""

    def examples(self, tokenizer: Any, rows: Sequence[Any], config: TrainConfig) -> list[Example]:
        """:func:`~trainer_service.examples.tokenize_examples`: loss on the answer only."""
        return tokenize_examples(tokenizer, rows, config.max_seq_len)

    def batch_rows(self, config: TrainConfig) -> int:
        """One sequence per example."""
        return 1

    def tokens(self, example: Example) -> TokenCounts:
        """The example's tokens (prompt and answer)."""
        return TokenCounts(training=len(example.input_ids))

    def loss(self, policy: Policy, batch: Sequence[Example], config: TrainConfig) -> StepLoss:
        """``-mean(log p(answer token))`` over the batch's supervised tokens (its weight); no extra metrics."""
        logprobs, _ = policy.logprobs(*collate(batch, policy.pad_token_id, policy.device.torch_device))
        return StepLoss(-logprobs.mean(), weight=logprobs.numel())
