"""``grpo``: Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", §4.1, eq. 3) with the suite's own
scorer as the reward, on prompts of training-pool items (``prompt_only`` rows, or the run's training pool rendered
by a harness; validation and test items never).

Each step, for each of the batch's prompts ``q``, the policy as it is samples a group of ``G`` completions
``o_1 … o_G`` (``recipe.grpo_group_size``, at ``recipe.grpo_temperature``, at most ``recipe.grpo_max_new_tokens``
tokens each, cut where ``max_seq_len`` ends); the grader scores each against the prompt's item (``reward``, a callable
the worker gives, see :class:`GRPO`), and each completion's advantage is its reward normalized within its group,
``A_i = (r_i - mean(r)) / (std(r) + 1e-4)`` (TRL's ``scale_rewards="group"``; a group whose rewards are all equal
teaches nothing). With one policy update per generation (μ = 1), the loss is

    ``L = -1/G Σ_i 1/|o_i| Σ_t [ ρ_{i,t} A_i - β · KL_{i,t} ]``,  ``ρ_{i,t} = π(o_{i,t}) / sg(π(o_{i,t}))``

(``ρ`` is 1 but carries the policy gradient ``A_i ∇ log π``), averaged over the batch's prompts, where the KL to the
reference policy is the unbiased ``k3`` estimator ``π_ref/π - log(π_ref/π) - 1`` (Schulman 2020, as in the paper and
TRL's ``GRPOTrainer``) and ``β`` is ``recipe.grpo_kl_coef`` (0: the reference is not evaluated). Log-probabilities
are the loop's (:meth:`~trainer_service.policy.Policy.logprobs`); TRL's trainer computes the same loss inside its
own loop, which would bypass this trainer's checkpoints, resume, metering and cancellation.

Tokens: a step's training tokens are its ``G`` sequences per prompt (prompt and completion), its rollouts' prefill
the ``G`` prompt copies the generation computes and its decode the tokens generated, billed as inference's are; the
job's hold covers every rollout at full length (:meth:`GRPO.tokens`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from trainer_service.config import TrainConfig
from trainer_service.examples import IGNORE_INDEX, Example, UntrainableRows, collate
from trainer_service.metrics import TokenCounts
from trainer_service.policy import Policy
from trainer_service.steps import StepLoss, method_step

Reward = Callable[[list["PromptExample"], list[list[int]]], list[float]]
"""``reward(examples, completions) -> rewards``: for each completion (its token ids, ending with the end-of-sequence
token when the model stopped) of the prompt of ``examples[i]``, its reward: the suite's score in [0, 1] against the
training-pool item ``examples[i].item_id``, or the job's grader's against the row's fields ``examples[i].reference``."""

ADVANTAGE_EPS = 1e-4
"""Added to a group's reward standard deviation before dividing (TRL's ``GRPOTrainer``)."""


@dataclass
class PromptExample:
    """A ``prompt_only`` row tokenized: the training-pool item it is rewarded against (``item_id``, or ``None``) and the
    row's other fields (``reference``: what a grader reads as ``item``), its prompt's tokens (chat template with the
    assistant header), and what one step of it may spend: ``group_size`` rollouts of at most ``max_new_tokens`` tokens."""

    item_id: str | None
    prompt_ids: list[int]
    group_size: int
    max_new_tokens: int
    reference: dict[str, Any] = field(default_factory=dict)


@method_step("grpo")
class GRPO:
    """GRPO's loss over groups of sampled completions. ``reward``: scores completions (the worker's call to the grader);
    ``None`` where only examples and token counts are needed (a job's estimate), and :meth:`loss` then raises
    ``RuntimeError``. Step metrics: ``reward_mean``, ``reward_std`` (mean within-group standard deviation), ``kl``
    (mean per-token KL to the reference), ``completion_tokens`` (mean rollout length), ``groups_with_signal``
    (share of prompts whose group's rewards differ)."""

    def __init__(self, reward: Reward | None = None) -> None:
        self.reward = reward

    def examples(self, tokenizer: Any, rows: Sequence[Any], config: TrainConfig) -> list[PromptExample]:
        """Each row's prompt (``prompt_messages()``, ``item_id``) rendered with the chat template and its generation
        prompt; a rollout may use what ``config.max_seq_len`` leaves after the prompt, up to ``grpo_max_new_tokens``.
        ``UntrainableRows`` for rows whose prompt leaves no room for a single generated token."""
        examples = []
        for row in rows:
            text = tokenizer.apply_chat_template(row.prompt_messages(), tokenize=False, add_generation_prompt=True)
            prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            room = min(config.grpo_max_new_tokens, config.max_seq_len - len(prompt_ids))
            examples.append(PromptExample(row.item_id, prompt_ids, config.grpo_group_size, max(room, 0), row.reference()))
        if empty := [i for i, e in enumerate(examples) if e.max_new_tokens == 0]:
            raise UntrainableRows(empty, config.max_seq_len)
        return examples

    def batch_rows(self, config: TrainConfig) -> int:
        """The group: ``grpo_group_size`` sequences per prompt."""
        return config.grpo_group_size

    def tokens(self, example: PromptExample) -> TokenCounts:
        """At most: ``G`` sequences of prompt plus ``max_new_tokens`` trained, ``G`` prompts prefilled, ``G × max_new_tokens`` decoded."""
        g, prompt = example.group_size, len(example.prompt_ids)
        return TokenCounts(training=g * (prompt + example.max_new_tokens), prefill=g * prompt, decode=g * example.max_new_tokens)

    def loss(self, policy: Policy, batch: Sequence[PromptExample], config: TrainConfig) -> StepLoss:
        """Sample each prompt's group, score it, and return GRPO's loss (module docstring) with the step's exact tokens."""
        if self.reward is None:
            raise RuntimeError("GRPO needs a reward function to train")
        sequences: list[Example] = []
        rewarded: list[PromptExample] = []
        completions: list[list[int]] = []
        prefill = 0
        for example in batch:
            group = policy.generate(example.prompt_ids, example.group_size, example.max_new_tokens, config.grpo_temperature)
            prefill += example.group_size * len(example.prompt_ids)
            for completion in group:
                sequences.append(Example(example.prompt_ids + completion, [IGNORE_INDEX] * len(example.prompt_ids) + completion))
                rewarded.append(example)
                completions.append(completion)
        rewards = torch.tensor(self.reward(rewarded, completions), dtype=torch.float32)
        if rewards.shape != (len(sequences),):
            raise RuntimeError(f"the reward function gave {tuple(rewards.shape)} rewards for {len(sequences)} completions")
        sizes = torch.tensor([e.group_size for e in batch])
        group_of = torch.repeat_interleave(torch.arange(len(batch)), sizes)
        advantages = torch.empty_like(rewards)
        stds = []
        for g in range(len(batch)):
            r = rewards[group_of == g]
            stds.append(float(r.std()))
            advantages[group_of == g] = (r - r.mean()) / (r.std() + ADVANTAGE_EPS)

        device = policy.device.torch_device
        tensors = collate(sequences, policy.pad_token_id, device)
        logprobs, rows = policy.logprobs(*tensors)
        per_token = -torch.exp(logprobs - logprobs.detach()) * advantages.to(device)[rows]
        kl = torch.zeros_like(logprobs)
        if config.grpo_kl_coef > 0:
            reference, _ = policy.reference_logprobs(*tensors)
            delta = reference - logprobs
            kl = torch.exp(delta) - delta - 1
            per_token = per_token + config.grpo_kl_coef * kl
        lengths = torch.tensor([len(c) for c in completions], device=device, dtype=per_token.dtype)
        per_sequence = torch.zeros(len(sequences), device=device, dtype=per_token.dtype).index_add(0, rows, per_token) / lengths
        loss = per_sequence.mean()  # every group has G sequences: the mean over sequences is the mean over prompts of eq. 3
        decode = sum(len(c) for c in completions)
        metrics = {"reward_mean": float(rewards.mean()), "reward_std": sum(stds) / len(stds), "kl": float(kl.detach().mean()),
                   "completion_tokens": decode / len(completions), "groups_with_signal": sum(s > 0 for s in stds) / len(stds)}
        tokens = TokenCounts(training=sum(len(s.input_ids) for s in sequences), prefill=prefill, decode=decode)
        return StepLoss(loss, metrics, tokens)
