"""GRPO's environment as the trainer reaches it: the prompts of the run's training pool and the rewards of the
policy's completions, both from the grader (``/internal/training-pool/…``), which owns the suites and their scorers.

The grader answers for training-pool items only: validation and test items are neither rendered nor scored, and an
id that is not a training-pool item is a 422, whatever it is. A GRPO job acts for its run: the worker calls the
grader with the run context stored on the job when it was created.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer_service.estimate import TRAINING_POOL, TrainingRows, dataset_rows
from trainer_service.models import Dataset
from trainer_service.schemas import PromptOnlyRow
from trainer_service.service import Trainer

from services.common.auth import RunContext
from services.common.contracts import Harness, PoolCompletion, PoolPromptsRequest, Recipe, RewardRequest
from services.common.errors import Unprocessable, UpstreamProblem

if TYPE_CHECKING:
    from trainer_service.methods.grpo import Reward

REWARD_BATCH = 4096
"""Completions scored per call to the grader (its ``RewardRequest`` limit)."""


def _grader_problem(exc: UpstreamProblem) -> Exception:
    """The grader's 422 as the job's own: a suite whose tasks are not single completions is a problem of
    ``recipe.method``; a harness field keeps its name (the job's ``harness`` is the one the grader checked)."""
    if exc.status != 422:
        return exc
    field = str((exc.problem.get("extra") or {}).get("field") or exc.problem.get("field") or "harness")
    return Unprocessable(str(exc.problem.get("detail", exc)), field="recipe.method" if field == "suite" else field)


def grpo_rows(trainer: Trainer, ctx: RunContext, harness: Harness | None, datasets: list[Dataset], recipe: Recipe) -> TrainingRows:
    """The prompts a GRPO job trains on: the ``prompt_only`` rows of ``datasets``, each of whose ``item_id`` must be an
    item of the run's training pool, or with no dataset every training-pool item as ``harness`` renders it (the
    grader's default: the task's initial system's harness).

    Raises ``Unprocessable``: ``field="datasets"`` with ``dataset`` and ``line`` for an ``item_id`` that is not a
    training-pool item; the grader's 422 (``recipe.method`` for a suite of multi-turn tasks, ``harness…``); and
    passes ``UpstreamUnavailable`` through while the grader cannot be reached.
    """
    try:
        prompts = trainer.grader.pool_prompts(ctx, PoolPromptsRequest(harness=harness)).data
    except UpstreamProblem as exc:
        raise _grader_problem(exc) from None
    if not datasets:
        rows = [PromptOnlyRow.model_validate({"prompt": p.messages, "item_id": p.item_id}) for p in prompts]
        return TrainingRows(rows, [(TRAINING_POOL, i + 1) for i in range(len(rows))])
    found = dataset_rows(datasets, recipe)
    pool = {p.item_id for p in prompts}
    for row, (dataset_id, line) in zip(found.rows, found.where, strict=True):
        if row.item_id not in pool:
            raise Unprocessable(f"line {line} of dataset {dataset_id}: item_id {row.item_id!r} is not an item of the run's training pool "
                                "(GET /v1/suite/train-sample lists them); GRPO rewards training-pool items only",
                                field="datasets", dataset=dataset_id, line=line)
    return found


def reward_function(trainer: Trainer, ctx: RunContext, harness: Harness | None, tokenizer: Any) -> Reward:
    """GRPO's reward for a job of run ``ctx``: completions decoded with ``tokenizer`` (special tokens dropped), scored by
    the grader against their training-pool items, :data:`REWARD_BATCH` a call. Raises what the grader's client raises
    (the job then fails and is charged for the steps it did)."""

    def reward(item_ids: list[str], completions: list[list[int]]) -> list[float]:
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards: list[float] = []
        for start in range(0, len(texts), REWARD_BATCH):
            batch = [PoolCompletion(item_id=i, completion=t) for i, t in zip(item_ids[start:start + REWARD_BATCH], texts[start:start + REWARD_BATCH],
                                                                             strict=True)]
            rewards += [r.reward for r in trainer.grader.pool_rewards(ctx, RewardRequest(harness=harness, completions=batch)).data]
        return rewards

    return reward
