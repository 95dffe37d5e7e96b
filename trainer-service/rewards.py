"""GRPO's environment as the trainer reaches it: the prompts of the run's training pool and the rewards of the
policy's completions, both from the grader (``/internal/training-pool/…``), which owns the suites and their scorers;
or, for a job with a ``grader`` spec (OpenAI's graders, :mod:`services.common.graders`), the prompts of its
``prompt_only`` datasets and their rewards by that grader against each row's other fields (``/internal/graders/run``:
python graders run in the grader's sandbox, model graders through the run's metered inference).

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
from services.common.graders import Grader, GraderRunRequest, GraderSample, check_templates

if TYPE_CHECKING:
    from trainer_service.methods.grpo import PromptExample, Reward

REWARD_BATCH = 4096
"""Completions scored per call to the grader (its ``RewardRequest`` limit)."""


def _grader_problem(exc: UpstreamProblem) -> Exception:
    """The grader's 422 as the job's own: a suite whose tasks are not single completions is a problem of
    ``recipe.method``; a harness field keeps its name (the job's ``harness`` is the one the grader checked)."""
    if exc.status != 422:
        return exc
    field = str((exc.problem.get("extra") or {}).get("field") or exc.problem.get("field") or "harness")
    return Unprocessable(str(exc.problem.get("detail", exc)), field="recipe.method" if field == "suite" else field)


def graded_rows(grader: Grader, datasets: list[Dataset], recipe: Recipe) -> TrainingRows:
    """The prompts a graded GRPO job trains on: its ``prompt_only`` datasets' rows, each of whose fields every template of
    ``grader`` can read (:func:`services.common.graders.check_templates`). ``Unprocessable``: ``field="datasets"``
    with ``dataset`` and ``line`` naming the row and the variable it lacks."""
    found = dataset_rows(datasets, recipe)
    for row, (dataset_id, line) in zip(found.rows, found.where, strict=True):
        if problem := check_templates(grader, row.reference()):
            raise Unprocessable(f"line {line} of dataset {dataset_id}: the grader's template {problem}", field="datasets", dataset=dataset_id, line=line)
    return found


def grpo_rows(trainer: Trainer, ctx: RunContext, harness: Harness | None, grader: Grader | None, datasets: list[Dataset],
              recipe: Recipe) -> TrainingRows:
    """The prompts a GRPO job trains on: with a ``grader``, :func:`graded_rows`; else the ``prompt_only`` rows of
    ``datasets``, each of whose ``item_id`` must be an item of the run's training pool, or with no dataset every
    training-pool item as ``harness`` renders it (the grader's default: the task's initial system's harness).

    Raises ``Unprocessable``: ``field="datasets"`` with ``dataset`` and ``line`` for an ``item_id`` that is not a
    training-pool item; the grader's 422 (``recipe.method`` for a suite of multi-turn tasks, ``harness…``); and
    passes ``UpstreamUnavailable`` through while the grader cannot be reached.
    """
    if grader is not None:
        return graded_rows(grader, datasets, recipe)
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
        if row.item_id is None:
            raise Unprocessable(f"line {line} of dataset {dataset_id}: a row the suite's scorer rewards names its training-pool item "
                                "(item_id); rows rewarded by their own fields need the job's grader", field="datasets", dataset=dataset_id, line=line)
        if row.item_id not in pool:
            raise Unprocessable(f"line {line} of dataset {dataset_id}: item_id {row.item_id!r} is not an item of the run's training pool "
                                "(GET /v1/suite/train-sample lists them); GRPO rewards training-pool items only",
                                field="datasets", dataset=dataset_id, line=line)
    return found


def reward_function(trainer: Trainer, ctx: RunContext, harness: Harness | None, grader: Grader | None, tokenizer: Any) -> Reward:
    """GRPO's reward for a job of run ``ctx``: completions decoded with ``tokenizer`` (special tokens dropped), scored by
    the grader service, :data:`REWARD_BATCH` a call: by ``grader`` against each prompt's row fields when the job has one,
    else by the suite's scorer against their training-pool items. Raises what the grader's client raises (the job then
    fails and is charged for the steps it did; a model grader past the budget is the ledger's 402)."""

    def reward(examples: list[PromptExample], completions: list[list[int]]) -> list[float]:
        texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
        rewards: list[float] = []
        for start in range(0, len(texts), REWARD_BATCH):
            chunk = list(zip(examples[start:start + REWARD_BATCH], texts[start:start + REWARD_BATCH], strict=True))
            if grader is not None:
                samples = [GraderSample(output_text=t, item=e.reference) for e, t in chunk]
                rewards += [r.reward for r in trainer.grader.run_grader(ctx, GraderRunRequest(grader=grader, samples=samples)).data]
            else:
                batch = [PoolCompletion(item_id=e.item_id or "", completion=t) for e, t in chunk]
                rewards += [r.reward for r in trainer.grader.pool_rewards(ctx, RewardRequest(harness=harness, completions=batch)).data]
        return rewards

    return reward
