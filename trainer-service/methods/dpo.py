"""``dpo``: Direct Preference Optimization (Rafailov et al. 2023, "Direct Preference Optimization: Your Language
Model is Secretly a Reward Model", eq. 7) on ``preference`` rows (``prompt``, ``chosen``, ``rejected``).

For a pair, with ``π`` the policy being trained and ``π_ref`` the reference (the model as the job started),
``loss = -log σ(β · ((log π(y_c|x) - log π_ref(y_c|x)) - (log π(y_r|x) - log π_ref(y_r|x))))``, the sigmoid
loss TRL's ``DPOTrainer`` uses by default; ``β`` is ``recipe.dpo_beta``. Log-probabilities are sums over the
answer's tokens (its text and the chat template's end-of-turn tokens) after the prompt's messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from trainer_service.config import TrainConfig
from trainer_service.examples import IDENTICAL_PAIRS, Example, UntrainableRows, collate, tokenize_turns
from trainer_service.logprobs import sequence_logprobs
from trainer_service.metrics import TokenCounts
from trainer_service.policy import Policy
from trainer_service.steps import StepLoss, method_step


@dataclass
class PreferencePair:
    """A preference row tokenized: the same prompt followed by the chosen and by the rejected answer."""

    chosen: Example
    rejected: Example


@method_step("dpo")
class DPO:
    """DPO's sigmoid loss over preference pairs; the step's metrics are the implicit rewards' accuracy and margin."""

    refuse_identical = True
    """A pair whose two answers are the same tokens trains on nothing here (ORPO's NLL term still trains on it)."""

    def examples(self, tokenizer: Any, rows: Sequence[Any], config: TrainConfig) -> list[PreferencePair]:
        """Each row as a :class:`PreferencePair`. ``UntrainableRows`` for rows where either answer is cut away, then
        for rows whose chosen and rejected answers are the same tokens after the cut."""
        pairs, max_seq_len = [], config.max_seq_len
        for row in rows:
            prompt = row.prompt_messages()
            pairs.append(PreferencePair(tokenize_turns(tokenizer, prompt, {"role": "assistant", "content": row.chosen}, max_seq_len),
                                        tokenize_turns(tokenizer, prompt, {"role": "assistant", "content": row.rejected}, max_seq_len)))
        if empty := [i for i, p in enumerate(pairs) if p.chosen.num_supervised == 0 or p.rejected.num_supervised == 0]:
            raise UntrainableRows(empty, max_seq_len)
        if self.refuse_identical and (same := [i for i, p in enumerate(pairs) if p.chosen.input_ids == p.rejected.input_ids]):
            raise UntrainableRows(same, max_seq_len, IDENTICAL_PAIRS)
        return pairs

    def batch_rows(self, config: TrainConfig) -> int:
        """The chosen and the rejected sequence."""
        return 2

    def tokens(self, example: PreferencePair) -> TokenCounts:
        """Both sequences' tokens."""
        return TokenCounts(training=len(example.chosen.input_ids) + len(example.rejected.input_ids))

    def loss(self, policy: Policy, batch: Sequence[PreferencePair], config: TrainConfig) -> StepLoss:
        """The mean DPO loss of the pairs. Metrics: ``reward_accuracy`` (share of pairs whose implicit reward
        ``β·(log π - log π_ref)`` is higher for the chosen answer), ``reward_margin`` (its mean difference),
        ``chosen_logprob`` (mean log-likelihood of the chosen answers under the policy)."""
        n = len(batch)
        tensors = collate([p.chosen for p in batch] + [p.rejected for p in batch], policy.pad_token_id, policy.device.torch_device)
        policy_seq = sequence_logprobs(*policy.logprobs(*tensors), 2 * n)
        reference_seq = sequence_logprobs(*policy.reference_logprobs(*tensors), 2 * n)
        rewards = config.dpo_beta * (policy_seq - reference_seq)
        margin = rewards[:n] - rewards[n:]
        loss = -F.logsigmoid(margin).mean()
        return StepLoss(loss, {"reward_accuracy": float((margin > 0).float().mean()), "reward_margin": float(margin.detach().mean()),
                               "chosen_logprob": float(policy_seq[:n].detach().mean())})
