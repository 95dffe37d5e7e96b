"""Benchmarks (operators): the benchmark file checked, its tasks registered with the grader, its baselines read back.

The grader grades each task of a benchmark as a task of its own, under its own id: a one-task benchmark's
task has the benchmark's id, the tasks of a ``tasks`` list get fresh ones (``Benchmark.tasks``).
"""

from __future__ import annotations

import secrets
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.models import Benchmark
from gateway.schemas import EVALUATOR_TASK, BenchmarkFile, BenchmarkOut, TaskSpec
from gateway.service import Gateway
from services.common.candidates import assign
from services.common.contracts import BenchmarkBaselines, EvaluatorBudget, EvaluatorTask, GradingSpec, Harness, SystemSpec, TargetRef
from services.common.errors import Conflict, Unprocessable
from services.common.harness import apply_settings
from services.common.ids import new_id


def benchmark_out(b: Benchmark, warnings: list[str] | None = None) -> BenchmarkOut:
    return BenchmarkOut(id=b.id, name=b.name, spec=BenchmarkFile.model_validate(b.spec), created_at=b.created_at, warnings=warnings or [])


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


async def load_benchmark(gw: Gateway, doc: Any) -> BenchmarkOut:
    """Register a benchmark: validate (its models among those inference serves), have the grader build each task's splits, store it. Same name and same
    document → the existing benchmark; same name, different document → ``Conflict``. The answer's ``warnings``
    (first load only) are the grader's, e.g. a task whose items are few enough to enumerate."""
    spec = parse_benchmark(doc)
    await check_models(gw, spec)

    def existing() -> BenchmarkOut | None:
        with gw.db.session() as s:
            b = repository.benchmark_by_name(s, spec.name)
            if b is not None and BenchmarkFile.model_validate(b.spec) != spec:
                raise Conflict(f"benchmark {spec.name!r} exists with a different definition; choose a new name", field="name")
            return None if b is None else benchmark_out(b)

    if (out := await run_in_threadpool(existing)) is not None:
        return out
    bm_id = new_id("bm")
    tasks = spec.task_list()
    ids = {t.name: bm_id if spec.tasks is None else new_id("bm") for t in tasks}
    warnings: list[str] = []
    key = (gw.settings.candidate_key or secrets.token_hex(32)) if spec.track == "evaluator" else None
    candidates = named_candidates(spec, key) if key else {}
    for t in sorted(tasks, key=lambda t: t.name == EVALUATOR_TASK):  # the evaluator track's own task after its targets
        warnings += (await gw.grader.register_task(grading_spec(spec, t, ids[t.name], candidates, ids))).warnings

    def store() -> BenchmarkOut:
        with gw.db.session() as s:
            return benchmark_out(repository.add_benchmark(s, bm_id, spec.name, spec.model_dump(mode="json"), ids, candidate_key=key), warnings)

    return await run_in_threadpool(store)


def list_benchmarks(gw: Gateway) -> list[BenchmarkOut]:
    with gw.db.session() as s:
        return [benchmark_out(b) for b in repository.benchmarks(s)]


async def benchmark_baselines(gw: Gateway, ref: str) -> BenchmarkBaselines:
    """The grader's status of each task of a benchmark (by id or name): split sizes and baseline test scores, with the
    states summed up over the tasks (:class:`BenchmarkBaselines`). ``NotFound`` for an unknown benchmark."""
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

    return BenchmarkBaselines(benchmark_id=benchmark_id, tasks=tasks, initial_status=overall({t.initial_status for t in tasks.values()}),
                              reference_status=overall({t.reference_status for t in tasks.values()}))
