"""Which examples each optimizer step takes, and so the tokens a job processes before it runs.

The data order is a pure function of ``(seed, step)``: the example at global position ``i`` is
``permutation(seed, epoch=i // n)[i % n]`` and step ``s`` (1-based) takes positions ``(s-1)*batch_size ...
s*batch_size - 1`` (:func:`batch_indices`). A checkpoint therefore only needs the step number (and the seed, batch
size and number of examples, which a resume checks) to restore the data position, and :func:`count_tokens` computes
a job's tokens before it starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from trainer_service.config import TrainConfig
from trainer_service.metrics import TokenCounts
from trainer_service.steps import Method


def batch_indices(step: int, n_rows: int, batch_size: int, seed: int) -> list[int]:
    """Example indices of 1-based ``step``: positions ``(step-1)*batch_size ...`` of the seeded epoch permutations."""
    start = (step - 1) * batch_size
    indices = []
    permutation, epoch = None, -1
    for position in range(start, start + batch_size):
        if position // n_rows != epoch:
            epoch = position // n_rows
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            permutation = torch.randperm(n_rows, generator=generator).tolist()
        indices.append(permutation[position % n_rows])
    return indices


def count_tokens(method: Method, examples: Sequence[Any], config: TrainConfig) -> TokenCounts:
    """The tokens a full run of ``config.max_steps`` steps of ``method`` over ``examples`` processes and bills:
    ``method.tokens`` of each example of each step, in the loop's data order. Exact for a method whose
    examples' sequences are known before training (SFT, DPO), an upper bound for one that generates (GRPO: every
    rollout as long as ``max_new_tokens`` allows), and for any run of the job (stopped or resumed runs process fewer).
    ``ValueError`` for no examples.
    """
    if not examples:
        raise ValueError("no training rows")
    per_example = [method.tokens(e) for e in examples]
    total = TokenCounts()
    for step in range(1, config.max_steps + 1):
        for i in batch_indices(step, len(per_example), config.batch_size, config.seed):
            total += per_example[i]
    return total
