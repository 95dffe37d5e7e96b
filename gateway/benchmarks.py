"""Benchmarks (operators): the benchmark file checked, its tasks registered with the grader (which builds their splits
in the background: a benchmark is ``building``, then ``ready`` or ``failed``), its status and baselines read back.

The grader grades each task of a benchmark as a task of its own, under its own id: a one-task benchmark's
task has the benchmark's id, the tasks of a ``tasks`` list get fresh ones (``Benchmark.tasks``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.models import Benchmark
from gateway.schemas import EVALUATOR_TASK, BenchmarkFile, BenchmarkOut, BenchmarkStatus, TaskSpec
from gateway.service import Gateway
from services.common.candidates import assign
from services.common.contracts import (
    BenchmarkBaselines,
    EvaluatorBudget,
    EvaluatorTask,
    GradingSpec,
    GradingTaskStatus,
    Harness,
    SystemSpec,
    TargetRef,
)
from services.common.db import serialize
from services.common.errors import BenchmarkNotReady, Conflict, Unprocessable, UpstreamProblem
from services.common.harness import apply_settings
from services.common.ids import new_id

BUILDING_RETRY_AFTER_S = 10
"""What a refused run creation on a benchmark still building says to wait (seconds)."""


def benchmark_out(b: Benchmark, tasks: Mapping[str, GradingTaskStatus | None]) -> BenchmarkOut:
    """``b`` with its status, as the grader's status of each of its ``tasks`` (by name) says (:func:`benchmark_status`),
    and the tasks' warnings for the operator."""
    status, error = benchmark_status(tasks)
    return BenchmarkOut(id=b.id, name=b.name, spec=BenchmarkFile.model_validate(b.spec), created_at=b.created_at, status=status, error=error,
                        warnings=[w for t in tasks.values() if t for w in t.warnings])


def parse_benchmark(doc: Any) -> BenchmarkFile:
    """Validate a benchmark document; raises ``Unprocessable`` naming the key path and the reason. Which models it
    names is checked against what inference serves when it is loaded (:func:`check_models`)."""
    try:
        return BenchmarkFile.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(document)"
        raise Unprocessable(f"{field}: {err['msg']}", field=field) from exc


async def check_models(gw: Gateway, spec: BenchmarkFile) -> None:
    """Every initial and reference system of ``spec`` names a base model inference serves now (not a run's checkpoint;
    the served models' cards, ``InferenceClient.list_base_models``), and a task that switches thinking on starts from a model that has a thinking mode; else ``Unprocessable`` naming
    the key path (``tasks.1.initial_system.model``)."""
    served = {card.name: card for card in (await gw.inference.list_base_models()).data}
    systems = [(f"candidates.{i}", c) for i, c in enumerate(spec.candidates or [])]
    for i, task in enumerate(spec.task_list()):
        prefix = "" if spec.tasks is None else f"tasks.{i}."
        systems += [(f"{prefix}initial_system", task.initial_system), (f"{prefix}reference.system", task.reference.system if task.reference else None)]
    for key, system in systems:
        if system is not None and system.model not in served:
            field = f"{key}.model"
            raise Unprocessable(f"{field}: unknown base model {system.model!r}; served: {', '.join(sorted(served)) or 'none'} "
                                "(an operator registers more with POST /admin/models)", field=field)
    for i, task in enumerate(spec.task_list()):
        if task.initial_system and task.evaluation and task.evaluation.thinking and not served[task.initial_system.model].thinking:
            field = "evaluation.thinking" if spec.tasks is None or not spec.tasks[i].evaluation else f"tasks.{i}.evaluation.thinking"
            raise Unprocessable(f"{field}: {task.initial_system.model} has no thinking mode; leave it null or false", field=field)


def grading_spec(spec: BenchmarkFile, task: TaskSpec, task_id: str, candidates: dict[str, SystemSpec] | None = None,
                 task_ids: dict[str, str] | None = None) -> GradingSpec:
    """What the grader is told of one task of ``spec``, whose grader id is ``task_id``. On the evaluator track a target's
    and the track's own task carry the ``candidates`` by opaque name (default: named under an empty key, for checks that
    serve none), whose first stands as the initial system, which is not graded; the own task also names its targets'
    grader ids (``task_ids``, by task name)."""
    if spec.track == "evaluator":
        candidates = candidates or named_candidates(spec, "")
        evaluator = None
        if task.name == EVALUATOR_TASK:
            targets = [TargetRef(name=t.name, task_id=(task_ids or {}).get(t.name, f"bm_{t.name}"), sealed=t.target == "sealed") for t in spec.tasks or []]
            evaluator = EvaluatorTask(targets=targets, budget=spec.evaluator or EvaluatorBudget())
        return GradingSpec(task_id=task_id, task=task.name, suite=task.suite, initial_system=candidates["candidate-01"], evaluation=task.evaluation,
                           audit=spec.audit, target=task.target, candidates=candidates, evaluator=evaluator)
    assert task.initial_system is not None and task.reference is not None  # TaskSpec's rule
    return GradingSpec(task_id=task_id, task=task.name, suite=task.suite, initial_system=task.initial_system,
                       reference_system=task.reference.system, reference_score=task.reference.score, evaluation=task.evaluation, audit=spec.audit)


def named_candidates(spec: BenchmarkFile, key: str) -> dict[str, SystemSpec]:
    """``spec``'s candidates named under ``key``, each as evaluated: its harness (the default declarative harness when it
    gives none, not a suite's: a candidate is one system on every target) with the benchmark's evaluation settings
    applied, so the run's chat calls and the targets' gradings meet the same system."""
    systems = [SystemSpec(model=c.model, harness=apply_settings(c.harness or Harness(), spec.evaluation)) for c in spec.candidates or []]
    return assign(systems, key) if systems else {}


@dataclass(frozen=True)
class _Stored:
    """What a stored benchmark row says of its grading: its id, its tasks' grader ids (by task name), its candidate key."""

    id: str
    task_ids: dict[str, str]
    candidate_key: str | None


async def load_benchmark(gw: Gateway, doc: Any) -> BenchmarkOut:
    """Register a benchmark and answer at once, its ``status`` ``building`` while the grader builds its tasks' splits in
    the background (then grades its baselines); ``ready`` once every task's splits are stored, ``failed`` with ``error``.

    Idempotent, also when calls overlap or one is cut off mid-way: the row is stored first, under the unique name and
    in one transaction, with the grader ids of its tasks; each task is then registered with the grader under those ids,
    which the grader treats as idempotent (no second split, no second baseline grading). So the same name and document
    again, after a timeout or beside a concurrent call, is the same benchmark and finishes what the first call left
    undone. Same name, different document: ``Conflict`` (field ``name``), unless the stored one failed or never reached
    the grader, which the new document then replaces. Validated first (its models among those inference serves); a task
    the grader refuses (422: suite params, a harness) takes the stored row away again. ``warnings`` are the grader's,
    once the splits are built, e.g. a task whose items are few enough to enumerate."""
    spec = parse_benchmark(doc)
    await check_models(gw, spec)
    stored = await _store_row(gw, spec)
    tasks = spec.task_list()
    candidates = named_candidates(spec, stored.candidate_key) if stored.candidate_key else {}
    registered: dict[str, GradingTaskStatus | None] = {}
    try:
        for t in sorted(tasks, key=lambda t: t.name == EVALUATOR_TASK):  # the evaluator track's own task after its targets
            registered[t.name] = await gw.grader.register_task(grading_spec(spec, t, stored.task_ids[t.name], candidates, stored.task_ids))
    except UpstreamProblem as exc:
        if 400 <= exc.status < 500:  # the grader refuses the file: it is not loaded
            await run_in_threadpool(_forget, gw, stored.id)
        raise
    def out() -> BenchmarkOut:
        with gw.db.session() as s:
            return benchmark_out(repository.find_benchmark(s, stored.id), registered)

    return await run_in_threadpool(out)


async def _store_row(gw: Gateway, spec: BenchmarkFile) -> _Stored:
    """The benchmark row of ``spec.name``: stored now with fresh grader ids (and, on the evaluator track, its candidate
    key), or the row stored before for the same document. Calls at once for one name run one after the other
    (``services.common.db.serialize``): one stores the row, the others read it. A row of another document is replaced
    when it failed (:func:`_replaceable`), else ``Conflict``."""

    def claim() -> tuple[_Stored, bool]:
        with gw.db.session() as s:
            serialize(s, f"benchmark:{spec.name}")
            b = repository.benchmark_by_name(s, spec.name)
            if b is None:
                bm_id = new_id("bm")
                ids = {t.name: bm_id if spec.tasks is None else new_id("bm") for t in spec.task_list()}
                key = (gw.settings.candidate_key or secrets.token_hex(32)) if spec.track == "evaluator" else None
                b = repository.add_benchmark(s, bm_id, spec.name, spec.model_dump(mode="json"), ids, candidate_key=key)
            return _Stored(b.id, b.task_ids(), b.candidate_key), BenchmarkFile.model_validate(b.spec) == spec

    stored, same = await run_in_threadpool(claim)
    if same:
        return stored
    if not await _replaceable(gw, stored):
        raise Conflict(f"benchmark {spec.name!r} exists with a different definition; choose a new name", field="name")
    await run_in_threadpool(_forget, gw, stored.id)
    stored, same = await run_in_threadpool(claim)
    if not same:  # yet another document took the name meanwhile
        raise Conflict(f"benchmark {spec.name!r} exists with a different definition; choose a new name", field="name")
    return stored


async def _replaceable(gw: Gateway, stored: _Stored) -> bool:
    """Whether a stored benchmark may give way to another document of its name: its build failed, or its tasks never
    reached the grader (a load cut off before). No run can be on it: a run needs a ready benchmark."""
    status, _ = benchmark_status(await _task_statuses(gw, stored.task_ids))
    return status == "failed"


def _forget(gw: Gateway, benchmark_id: str) -> None:
    """Delete the row of a benchmark that never became one (the grader refused it, or another document replaces it)."""
    with gw.db.session() as s:
        repository.delete_benchmark(s, benchmark_id)


NOT_REGISTERED = "not registered with the grader (a load was cut off): load the file again"


async def _task_statuses(gw: Gateway, task_ids: dict[str, str]) -> dict[str, GradingTaskStatus | None]:
    """The grader's status of each task (by name); ``None`` for one it does not know."""
    async def one(task_id: str) -> GradingTaskStatus | None:
        try:
            return await gw.grader.task_status(task_id)
        except UpstreamProblem as exc:
            if exc.status == 404:
                return None
            raise

    answers = await asyncio.gather(*(one(task_id) for task_id in task_ids.values()))
    return dict(zip(task_ids, answers, strict=True))


def benchmark_status(tasks: Mapping[str, GradingTaskStatus | None]) -> tuple[BenchmarkStatus, str | None]:
    """A benchmark's status from its tasks' (``None``: a task the grader does not know): ``failed`` if one failed or is
    unknown, with each such task's reason (``name: why``), else ``building`` while one builds, else ``ready``."""
    failed = {name: (t.splits_error if t else NOT_REGISTERED) for name, t in tasks.items() if t is None or t.splits == "failed"}
    if failed:
        return "failed", "; ".join(f"{name}: {why}" for name, why in failed.items())
    return ("building" if any(t and t.splits == "building" for t in tasks.values()) else "ready"), None


async def benchmark_info(gw: Gateway, ref: str) -> BenchmarkOut:
    """Benchmark ``ref`` (id or name) with its status as the grader has it; ``NotFound`` for an unknown benchmark."""
    def find() -> Benchmark:
        with gw.db.session() as s:
            return repository.find_benchmark(s, ref)

    b = await run_in_threadpool(find)
    return benchmark_out(b, await _task_statuses(gw, b.task_ids()))


async def list_benchmarks(gw: Gateway) -> list[BenchmarkOut]:
    """Every benchmark, oldest first, each with its status as the grader has it."""
    def rows() -> list[Benchmark]:
        with gw.db.session() as s:
            return repository.benchmarks(s)

    found = await run_in_threadpool(rows)
    statuses = await asyncio.gather(*(_task_statuses(gw, b.task_ids()) for b in found))
    return [benchmark_out(b, tasks) for b, tasks in zip(found, statuses, strict=True)]


async def require_ready(gw: Gateway, b: Benchmark) -> None:
    """``BenchmarkNotReady`` (409, field ``benchmark``) unless every task of ``b`` has its splits: a run's first call
    would otherwise meet a task with no validation items yet. While they build, ``retry_after_s`` says when to try again."""
    status, error = benchmark_status(await _task_statuses(gw, b.task_ids()))
    if status == "building":
        raise BenchmarkNotReady(f"benchmark {b.name!r} is still building its splits; create the run once `crucible admin benchmarks` shows it "
                                "ready", field="benchmark", retry_after_s=BUILDING_RETRY_AFTER_S)
    if status == "failed":
        raise BenchmarkNotReady(f"benchmark {b.name!r} failed to build its splits ({error}); fix the file and load it again", field="benchmark")


async def benchmark_baselines(gw: Gateway, ref: str) -> BenchmarkBaselines:
    """The grader's status of each task of a benchmark (by id or name): split sizes and baseline test scores, with the
    states summed up over the tasks (:class:`BenchmarkBaselines`; a task still building its splits counts as a baseline
    ``running``, one whose build failed as ``failed``). ``NotFound`` for an unknown benchmark."""
    def task_ids() -> tuple[str, dict[str, str]]:
        with gw.db.session() as s:
            bm = repository.find_benchmark(s, ref)
            return bm.id, bm.task_ids()

    benchmark_id, ids = await run_in_threadpool(task_ids)
    tasks = {name: await gw.grader.task_status(gid) for name, gid in ids.items()}

    def overall(states: set[str | None]) -> str | None:
        states -= {None}  # a task without a reference
        if not states or states == {"declared"}:
            return "declared" if states else None
        return "failed" if "failed" in states else ("succeeded" if states <= {"declared", "succeeded"} else "running")

    def initial(t: GradingTaskStatus) -> str | None:  # a task still building its splits has its baselines to come
        return {"building": "running", "failed": "failed"}.get(t.splits, t.initial_status)

    def reference(t: GradingTaskStatus) -> str | None:
        return "failed" if t.splits == "failed" and t.reference_status is None else t.reference_status

    return BenchmarkBaselines(benchmark_id=benchmark_id, tasks=tasks, initial_status=overall({initial(t) for t in tasks.values()}),
                              reference_status=overall({reference(t) for t in tasks.values()}))
