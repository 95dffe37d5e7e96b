"""Grading tasks: registering one (at once, idempotent on its id) and building its splits in the background (the hidden
test split into the test store, then its baseline evaluations queued), its status, its public training pool and its
validation items.

Splits (:mod:`grader.splits`): validation and the training pool are drawn from public seeds alone; the hidden test
split (seed from the grader's configuration only) is drawn around them, so no public answer depends on it.
"""

from __future__ import annotations

import structlog
from sqlalchemy.orm import Session

from grader import imports, repository, splits
from grader.harness_archives import code_harness_for
from grader.models import GradingTask
from grader.sandboxes import SandboxUnavailable
from grader.schemas import TaskRegistered
from grader.service import Grader
from grader.suites import Item, get_suite
from services.common import jobs
from services.common.auth import RunContext
from services.common.contracts import CandidateScore, GradingSpec, GradingTaskStatus, Harness, Score, SuiteItemOut, SystemSpec
from services.common.db import database_unavailable, serialize, utcnow
from services.common.errors import Conflict, NotFound, Unprocessable, UpstreamUnavailable
from services.common.harness import apply_settings, check_harness

log = structlog.get_logger("grader")

TRAIN_POOLS_KEPT = 16  # training pools a grader keeps in memory (the last read)
SPLITS_STATUS = {"queued": "building", "running": "building", "succeeded": "ready", "failed": "failed"}
"""A task's ``splits`` (:class:`GradingTaskStatus`) by the state of its build job."""


def harness_for(spec: GradingSpec, harness: Harness | None) -> Harness:
    """``harness`` (``None``: the suite's default) with the task's evaluation settings applied."""
    return apply_settings(harness or get_suite(spec.suite.name).default_harness, spec.evaluation)


def register_task(grader: Grader, spec: GradingSpec) -> TaskRegistered:
    """Register a task and queue the build of its splits (:func:`build_splits`, on an eval worker); answers at once,
    with ``splits`` ``building``. Idempotent on ``spec.task_id``, also under concurrent calls: the same spec again is the
    same task (no second build, no second baseline; a build that failed is queued again), another spec under that id
    ``Conflict`` (field ``task_id``).

    Raises ``Unprocessable`` naming the field for an unknown suite, bad suite params or a bad harness; what only drawing
    the splits finds (a split larger than the task space or the imported collection allows, a collection not ready)
    fails the build, with the reason in the task's status.
    """
    _check(grader, spec)
    if _add_or_requeue(grader, spec):
        if grader.enqueue_build is None:  # no queue: build now, in this call
            build_splits(grader, spec.task_id)
        else:
            grader.enqueue_build(spec.task_id)
    return TaskRegistered(**task_status(grader, spec.task_id).model_dump())


def _check(grader: Grader, spec: GradingSpec) -> None:
    """What can be checked without drawing a split: the suite, its params, the systems' harnesses (``Unprocessable``)."""
    suite = get_suite(spec.suite.name)
    suite.check_params(spec.suite.params)
    for system in (spec.initial_system, spec.reference_system, *spec.candidates.values()):
        if system and system.harness:
            check_harness(system.harness)
    _baseline_archives(grader, spec)


def _baseline_archives(grader: Grader, spec: GradingSpec) -> list[str | None]:
    """The code harness archive of the initial and the reference system (``None``: a declarative harness, or no
    reference); baselines may use the suites' own code harnesses only (a run's archive belongs to the run)."""
    suite = get_suite(spec.suite.name)
    return [code_harness_for(grader, None, suite, system.harness, system.harness_archive) if system else None
            for system in (spec.initial_system, spec.reference_system)]


def _add_or_requeue(grader: Grader, spec: GradingSpec) -> str | None:
    """Add the task's row, the build of its splits queued (``"created"``); for a task registered with the same spec, queue
    again a build that failed (``"requeued"``) or do nothing (``None``); ``Conflict`` for another spec under the id. Calls
    at once for one id run one after the other (``services.common.db.serialize``): one adds the row, the others read it."""
    with grader.db.session() as s:
        serialize(s, f"grading-task:{spec.task_id}")
        task = s.get(GradingTask, spec.task_id)
        if task is None:
            repository.add_task(s, spec)
            return "created"
        if task.spec != spec.model_dump(mode="json"):
            raise Conflict(f"task {spec.task_id} is registered with another spec", field="task_id")
        return "requeued" if repository.requeue_failed_task(s, spec.task_id) else None


def build_splits(grader: Grader, task_id: str) -> None:
    """Build a registered task's splits and queue its baselines: the eval worker's job (``grader.build_splits``), leased
    as ``services.common.jobs`` states, so a duplicate message builds nothing and a build whose worker died is taken back
    by the reconciler (:func:`grader.worker.reconcile_builds`).

    Draws the validation split and the training pool (public seeds) and the hidden test split around them (the
    grader's secret), stores the test items in the test store (once), then in one fenced transaction the validation
    items, the baseline evaluations, the operator's ``warnings`` (a task small enough to enumerate: public inputs only)
    and the status ``succeeded``; the baselines are sent after it commits. A split that
    cannot be drawn (``Unprocessable``) or any other error fails the build with its reason; a service or the database
    being away puts it back in the queue (``error`` says why), to be sent again.
    """
    if not jobs.claim(grader.db, GradingTask, task_id):
        return
    lease = jobs.Lease(grader.db, GradingTask, task_id, grader.settings.job_heartbeat_s).start()
    try:
        queued = _build(grader, task_id, lease)
    except jobs.LeaseLost:
        return
    except Exception as exc:  # noqa: BLE001 - every end of a build is written on its row
        again = isinstance(exc, UpstreamUnavailable | SandboxUnavailable) or database_unavailable(exc)
        if not again:
            log.exception("the build of a task's splits failed", task_id=task_id)
        reason = _reason(exc)
        with grader.db.session() as s:
            task = jobs.owned_row(s, GradingTask, task_id)
            if task is not None:
                task.status, task.worker_id, task.error = ("queued", None, f"retrying: {reason}") if again else ("failed", None, reason)
                task.enqueued_at, task.finished_at = (utcnow(), None) if again else (task.enqueued_at, utcnow())
        return
    finally:
        lease.stop()
    for eval_id in queued:
        grader.enqueue(eval_id)


def _reason(exc: Exception) -> str:
    """Why a build ended with ``exc``, for the operator: an ``Unprocessable``'s field and detail
    (``suite.splits.test.size: only 3 test items…``), else the exception's class and message."""
    if isinstance(exc, Unprocessable):
        return f"{exc.extra['field']}: {exc.detail}" if exc.extra.get("field") else exc.detail
    return f"{exc.__class__.__name__}: {exc}"


def _build(grader: Grader, task_id: str, lease: jobs.Lease) -> list[str]:
    """:func:`build_splits`'s work under ``lease``; returns the evaluations to send once it has committed."""
    with grader.db.session() as s:
        spec = repository.spec(s, task_id)
    archives = _baseline_archives(grader, spec)
    validation = splits.validation_split(spec)
    seed, public = splits.test_seed(grader.settings.grader_test_seed, spec), validation + splits.training_pool(spec, validation)
    if spec.evaluator is not None:  # the evaluator track's own task: every split is every candidate (public names)
        test = validation
    elif collection := spec.suite.splits.test.collection:
        test = splits.collection_split(spec, seed, imports.collection_items(grader, collection, spec.suite.name), public)
    else:
        test = splits.test_split(spec, seed, public)
    warning = None if spec.evaluator else splits.enumerable_warning(spec, splits.item_space(spec))
    if warning:
        log.warning("enumerable task", task_id=task_id, warning=warning)
    lease.check()
    grader.store.put_items(task_id, test)
    with grader.db.session() as s:
        task = lease.row(s)
        repository.add_validation_items(s, task_id, validation)
        if spec.target is not None:
            queued = _target_gradings(s, spec, validation, test)
        elif spec.evaluator is not None:  # nothing to grade until a run submits an evaluator
            queued = []
        else:
            queued = _baselines(s, task, spec, archives, len(test))
        task.status, task.worker_id, task.error, task.finished_at = "succeeded", None, None, utcnow()
        task.warnings = [warning] if warning else []
    return queued


def _baselines(s: Session, task: GradingTask, spec: GradingSpec, archives: list[str | None], test_items: int) -> list[str]:
    """Add the initial (and reference) system's test grading to ``task``; their ids."""
    baseline = {"run_id": None, "split": "test", "items_total": test_items}
    task.initial_evaluation_id = repository.add_evaluation(s, spec, purpose="initial", model=spec.initial_system.model,
                                                           harness=harness_for(spec, spec.initial_system.harness),
                                                           harness_archive=archives[0], **baseline).id
    if spec.reference_system is not None:
        task.reference_evaluation_id = repository.add_evaluation(s, spec, purpose="reference", model=spec.reference_system.model,
                                                                 harness=harness_for(spec, spec.reference_system.harness),
                                                                 harness_archive=archives[1], **baseline).id
    return [e for e in (task.initial_evaluation_id, task.reference_evaluation_id) if e]


def _target_gradings(s: Session, spec: GradingSpec, validation: list[Item], test: list[Item]) -> list[str]:
    """Add an evaluator-track target's grading of each of its candidates: on the validation split for a development
    target (whose scores the run may see: a function of public items alone), on the hidden test split for a sealed one.
    Not charged to any run. Their ids."""
    split, items = ("validation", validation) if spec.target == "development" else ("test", test)
    return [repository.add_evaluation(s, spec, run_id=None, purpose="candidate", split=split, model=system.model, harness=harness_for(spec, system.harness),
                                      items_total=len(items), candidate=name).id for name, system in spec.candidates.items()]


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
    """The task's split sizes, the state of its splits' build, its baselines' test scores and states, and the operator's
    warnings; raises ``NotFound`` unless it is registered."""
    with grader.db.session() as s:
        task = repository.grading_task(s, task_id)
        spec = GradingSpec.model_validate(task.spec)
        initial = repository.evaluation(s, task.initial_evaluation_id) if task.initial_evaluation_id else None
        archive = initial.harness_archive if initial else None
        reference = repository.evaluation(s, task.reference_evaluation_id) if task.reference_evaluation_id else None
        declared = (Score(value=spec.reference_score, n=0, metric=spec.evaluation.metric, k=spec.evaluation.samples)
                    if spec.reference_score is not None else None)
        initial_status = initial.status if initial else None
        if spec.target is not None and task.status == "succeeded":  # a target's baselines are its gradings of the candidates: their state summed up
            states = {ev.status for ev in repository.candidate_evaluations(s, task_id)}
            initial_status = next((x for x in ("failed", "cancelled", "running", "queued") if x in states), "succeeded")
        return GradingTaskStatus(
            task_id=task_id, validation_items=repository.count_validation_items(s, task_id), test_items=spec.suite.splits.test.size,
            initial=initial.score if initial else None, initial_status=initial_status,  # type: ignore[arg-type]
            reference=reference.score if reference else declared,  # type: ignore[arg-type]
            reference_status=reference.status if reference else ("declared" if declared else None),  # type: ignore[arg-type]
            initial_system=SystemSpec(model=spec.initial_system.model, harness_archive=archive,
                                      harness=None if archive else harness_for(spec, spec.initial_system.harness)),
            splits=SPLITS_STATUS[task.status], splits_error=task.error, warnings=task.warnings or [],
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
