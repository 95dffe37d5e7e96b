"""Grading tasks: registering one (its splits, the hidden test split into the test store, its baseline evaluations
queued), its status, its public training pool and its validation items.

Splits (:mod:`grader.splits`): validation and the training pool are drawn from public seeds alone; the hidden test
split (seed from the grader's configuration only) is drawn around them, so no public answer depends on it.
"""

from __future__ import annotations

import structlog

from grader import imports, repository, splits
from grader.harness_archives import code_harness_for
from grader.schemas import TaskRegistered
from grader.service import Grader
from grader.suites import Item, get_suite
from services.common.auth import RunContext
from services.common.contracts import CandidateScore, GradingSpec, GradingTaskStatus, Harness, Score, SuiteItemOut, SystemSpec
from services.common.errors import NotFound
from services.common.harness import apply_settings, check_harness

log = structlog.get_logger("grader")

TRAIN_POOLS_KEPT = 16  # training pools a grader keeps in memory (the last read)


def harness_for(spec: GradingSpec, harness: Harness | None) -> Harness:
    """``harness`` (``None``: the suite's default) with the task's evaluation settings applied."""
    return apply_settings(harness or get_suite(spec.suite.name).default_harness, spec.evaluation)


def register_task(grader: Grader, spec: GradingSpec) -> TaskRegistered:
    """Create the task's splits and queue its baseline evaluations; idempotent on ``spec.task_id``. Returns its status
    with ``warnings`` for the operator (a task small enough to enumerate), which depend on public inputs only (none
    when the task was registered before).

    Raises ``Unprocessable`` naming the field for an unknown suite, bad suite params, a bad harness, a split
    larger than the task space (or the imported collection's accepted tasks) allows, or a collection not ready.
    """
    with grader.db.session() as s:
        registered = repository.task_registered(s, spec.task_id)
    if registered:  # read in a session of its own: on SQLite a second one would wait for this one's lock
        return TaskRegistered(**task_status(grader, spec.task_id).model_dump())
    suite = get_suite(spec.suite.name)
    suite.check_params(spec.suite.params)
    for system in (spec.initial_system, spec.reference_system, *spec.candidates.values()):
        if system and system.harness:
            check_harness(system.harness)
    # baselines may use the suites' own code harnesses only (a run's archive belongs to the run)
    archives = [code_harness_for(grader, None, suite, system.harness, system.harness_archive) if system else None
                for system in (spec.initial_system, spec.reference_system)]
    validation = splits.validation_split(spec)
    seed, public = splits.test_seed(grader.settings.grader_test_seed, spec), validation + splits.training_pool(spec, validation)
    if spec.evaluator is not None:  # the evaluator track's own task: every split is every candidate (public names)
        test = validation
    elif collection := spec.suite.splits.test.collection:
        test = splits.collection_split(spec, seed, imports.collection_items(grader, collection, spec.suite.name), public)
    else:
        test = splits.test_split(spec, seed, public)
    grader.store.put_items(spec.task_id, test)
    warning = None if spec.evaluator else splits.enumerable_warning(spec, splits.item_space(spec))
    if warning:
        log.warning("enumerable task", task_id=spec.task_id, warning=warning)
    if spec.target is not None:
        return _register_target(grader, spec, validation, test)
    if spec.evaluator is not None:  # nothing to grade until a run submits an evaluator
        with grader.db.session() as s:
            repository.add_task(s, spec, validation)
        return TaskRegistered(**task_status(grader, spec.task_id).model_dump())
    with grader.db.session() as s:
        task = repository.add_task(s, spec, validation)
        baseline = {"run_id": None, "split": "test", "items_total": len(test)}
        task.initial_evaluation_id = repository.add_evaluation(s, spec, purpose="initial", model=spec.initial_system.model,
                                                               harness=harness_for(spec, spec.initial_system.harness),
                                                               harness_archive=archives[0], **baseline).id
        if spec.reference_system is not None:
            task.reference_evaluation_id = repository.add_evaluation(s, spec, purpose="reference", model=spec.reference_system.model,
                                                                     harness=harness_for(spec, spec.reference_system.harness),
                                                                     harness_archive=archives[1], **baseline).id
        queued = [e for e in (task.initial_evaluation_id, task.reference_evaluation_id) if e]
    for eval_id in queued:
        grader.enqueue(eval_id)
    return TaskRegistered(**task_status(grader, spec.task_id).model_dump(), warnings=[warning] if warning else [])


def _register_target(grader: Grader, spec: GradingSpec, validation: list[Item], test: list[Item]) -> TaskRegistered:
    """Add an evaluator-track target and queue the grading of each of its candidates: on the validation split for a
    development target (whose scores the run may see: a function of public items alone), on the hidden test split for a
    sealed one. Not charged to any run."""
    split, items = ("validation", validation) if spec.target == "development" else ("test", test)
    with grader.db.session() as s:
        repository.add_task(s, spec, validation)
        queued = [repository.add_evaluation(s, spec, run_id=None, purpose="candidate", split=split, model=system.model, harness=harness_for(spec, system.harness),
                                            items_total=len(items), candidate=name).id for name, system in spec.candidates.items()]
    for eval_id in queued:
        grader.enqueue(eval_id)
    return TaskRegistered(**task_status(grader, spec.task_id).model_dump())


def target_scores(grader: Grader, task_id: str) -> dict[str, Score | None]:
    """A target's score of each candidate (``None`` until graded), by opaque name. A sealed target's never leave the
    grader: only the evaluator's agreement with them does."""
    with grader.db.session() as s:
        return {ev.candidate: Score(**ev.score) if ev.score and ev.status == "succeeded" else None
                for ev in repository.candidate_evaluations(s, task_id) if ev.candidate}


def development_scores(grader: Grader, ctx: RunContext) -> list[CandidateScore]:
    """The run's task's score of each candidate, when that task is a development target; ``NotFound`` for any other
    task (a sealed target's scores never leave the grader)."""
    with grader.db.session() as s:
        spec = repository.spec(s, ctx.task_id)
    if spec.target != "development":
        raise NotFound(f"task {spec.task!r} is not a development target: only a development target's candidate scores are shown")
    return [CandidateScore(candidate=name, score=score) for name, score in target_scores(grader, ctx.task_id).items()]


def task_status(grader: Grader, task_id: str) -> GradingTaskStatus:
    """The task's split sizes and its baselines' test scores and states; raises ``NotFound`` unless it is registered."""
    with grader.db.session() as s:
        task = repository.grading_task(s, task_id)
        spec = GradingSpec.model_validate(task.spec)
        initial = repository.evaluation(s, task.initial_evaluation_id) if task.initial_evaluation_id else None
        archive = initial.harness_archive if initial else None
        reference = repository.evaluation(s, task.reference_evaluation_id) if task.reference_evaluation_id else None
        declared = (Score(value=spec.reference_score, n=0, metric=spec.evaluation.metric, k=spec.evaluation.samples)
                    if spec.reference_score is not None else None)
        initial_status = initial.status if initial else None
        if spec.target is not None:  # a target's baselines are its gradings of the candidates: their state summed up
            states = {ev.status for ev in repository.candidate_evaluations(s, task_id)}
            initial_status = next((x for x in ("failed", "cancelled", "running", "queued") if x in states), "succeeded")
        return GradingTaskStatus(
            task_id=task_id, validation_items=repository.count_validation_items(s, task_id), test_items=spec.suite.splits.test.size,
            initial=initial.score if initial else None, initial_status=initial_status,  # type: ignore[arg-type]
            reference=reference.score if reference else declared,  # type: ignore[arg-type]
            reference_status=reference.status if reference else ("declared" if declared else None),  # type: ignore[arg-type]
            initial_system=SystemSpec(model=spec.initial_system.model, harness_archive=archive,
                                      harness=None if archive else harness_for(spec, spec.initial_system.harness)),
        )


def train_pool(grader: Grader, task_id: str) -> list[Item]:
    """The task's public training pool (:func:`grader.splits.training_pool`): a function of the benchmark file alone,
    never of the test split. Kept in ``grader.train_pools`` (the last :data:`TRAIN_POOLS_KEPT` read)."""
    pool = grader.train_pools.get(task_id)
    if pool is None:
        with grader.db.session() as s:
            spec, validation = repository.spec(s, task_id), repository.validation_items(s, task_id)
        pool = grader.train_pools[task_id] = splits.training_pool(spec, validation)
        while len(grader.train_pools) > TRAIN_POOLS_KEPT:
            grader.train_pools.pop(next(iter(grader.train_pools)), None)
    return pool


def check_public(grader: Grader, ctx: RunContext) -> GradingSpec:
    """The run's task's spec, unless it is a sealed target of the evaluator track, whose items (every split of it) are
    as hidden as its scores: ``NotFound`` then, as for its candidate scores (:func:`development_scores`). A run that saw
    a sealed target's items could rebuild it and rank the candidates as it does."""
    with grader.db.session() as s:
        spec = repository.spec(s, ctx.task_id)
    if spec.target == "sealed":
        raise NotFound(f"task {spec.task!r} is a sealed target: neither its items nor its scores are shown")
    return spec


def train_sample(grader: Grader, ctx: RunContext, offset: int, limit: int) -> list[SuiteItemOut]:
    """Items ``[offset, offset+limit)`` of the run's task's training pool (question + answer); ``NotFound`` for a sealed
    target (:func:`check_public`)."""
    check_public(grader, ctx)
    return [SuiteItemOut(id=it.id, question=it.question, answer=it.answer) for it in train_pool(grader, ctx.task_id)[offset:offset + limit]]


def validation_items(grader: Grader, ctx: RunContext) -> list[SuiteItemOut]:
    """Every visible validation item of the run's task; ``NotFound`` for a sealed target (:func:`check_public`)."""
    check_public(grader, ctx)
    with grader.db.session() as s:
        return [SuiteItemOut(id=it.id, question=it.question, answer=it.answer) for it in repository.validation_items(s, ctx.task_id)]
