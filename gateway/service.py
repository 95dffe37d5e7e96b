"""Gateway logic: benchmarks, runs and keys, the run's permissions and deadline, forwarding, leaderboard.

Every agent call is authorized here (run key → run), checked against the run's deadline and editable
space, then forwarded to the owning service with the signed run context. Internal services' problem+json
answers pass through unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select
from starlette.concurrency import run_in_threadpool

from gateway.models import AuditEvent, Benchmark, EpisodeEvent, Run
from gateway.ratelimit import KeyRateLimiter
from gateway.schemas import (
    TRACKS,
    BenchmarkFile,
    BenchmarkOut,
    BudgetOut,
    LeaderboardRow,
    RefundRequest,
    RunCard,
    RunCreate,
    RunCreated,
    RunOut,
    TaskScore,
    TaskSpec,
)
from gateway.settings import GatewaySettings
from services.common.auth import RunContext, hash_secret, new_secret
from services.common.llms import BASE_MODELS
from services.common.contracts import TRAINING_FIELDS, EvaluationUsage, GradingSpec, Recipe
from services.common.db import Database, utcnow
from services.common.errors import Conflict, NotFound, OutsideEditableSpace, RunExpired, Unauthorized, Unprocessable
from services.common.http import AsyncServiceClient, ledger_client
from services.common.ids import has_prefix, new_id
from services.common.lazy import once


@dataclass
class Runtime:
    """The gateway's settings, database, limits and clients. Its calls to other services are async
    (:class:`AsyncServiceClient`): a request waiting for a busy service holds no worker thread."""

    settings: GatewaySettings
    db: Database
    ledger: AsyncServiceClient
    trainer: AsyncServiceClient
    inference: AsyncServiceClient
    grader: AsyncServiceClient
    limiter: KeyRateLimiter


@once
def runtime() -> Runtime:
    s = GatewaySettings()
    def client(url: str, name: str, timeout_s: float | None = None) -> AsyncServiceClient:
        return AsyncServiceClient(url, s.service_token, name=name, timeout_s=timeout_s or s.http_timeout_s)
    return Runtime(
        settings=s, db=Database(s.database_url_for("gateway")),
        ledger=ledger_client(s, AsyncServiceClient), trainer=client(s.trainer_url, "trainer", 120),
        inference=client(s.inference_url, "inference", 300), grader=client(s.grader_url, "grader", 300),
        limiter=KeyRateLimiter(s.rate_limits, s.rate_limit_storage),
    )


@dataclass(frozen=True)
class Caller:
    """An authenticated agent call: its run, its benchmark file, and the context sent to services.

    ``ctx.task_id`` is the grader's id of one task: the benchmark's only task, or the one named by the
    call (:func:`for_task`). ``tasks``: every task's name → grader id.
    """

    run: Run
    benchmark: BenchmarkFile
    ctx: RunContext
    tasks: dict[str, str]


# --------------------------------------------------------------------------- benchmarks (operators)


def _benchmark_out(b: Benchmark, warnings: list[str] | None = None) -> BenchmarkOut:
    return BenchmarkOut(id=b.id, name=b.name, spec=BenchmarkFile.model_validate(b.spec), created_at=b.created_at, warnings=warnings or [])


def parse_benchmark(doc: Any) -> BenchmarkFile:
    """Validate a benchmark document; raises ``Unprocessable`` naming the key path and the reason (also for an
    initial or reference system whose model is no base model: a benchmark cannot start from a run's checkpoint)."""
    try:
        spec = BenchmarkFile.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(document)"
        raise Unprocessable(f"{field}: {err['msg']}", field=field) from exc
    for i, task in enumerate(spec.task_list()):
        prefix = "" if spec.tasks is None else f"tasks.{i}."
        for key, system in (("initial_system", task.initial_system), ("reference.system", task.reference.system)):
            if system is not None and system.model not in BASE_MODELS:
                field = f"{prefix}{key}.model"
                raise Unprocessable(f"{field}: unknown base model {system.model!r}; known: {', '.join(sorted(BASE_MODELS))}", field=field)
        model = BASE_MODELS[task.initial_system.model]
        if task.evaluation and task.evaluation.thinking and not model.thinking:
            field = "evaluation.thinking" if spec.tasks is None or not spec.tasks[i].evaluation else f"tasks.{i}.evaluation.thinking"
            raise Unprocessable(f"{field}: {model.name} has no thinking mode; leave it null or false", field=field)
    return spec


def grading_spec(spec: BenchmarkFile, task: TaskSpec, benchmark_id: str) -> GradingSpec:
    """What the grader is told of one task of ``spec``: it grades each task as a benchmark of its own."""
    return GradingSpec(task_id=benchmark_id, task=task.name, suite=task.suite, initial_system=task.initial_system,
                       reference_system=task.reference.system, reference_score=task.reference.score, evaluation=task.evaluation, audit=spec.audit)


async def load_benchmark(doc: Any) -> BenchmarkOut:
    """Register a benchmark: validate, have the grader build its splits, store it. Same name and same
    document → the existing benchmark; same name, different document → ``Conflict``. The answer's ``warnings``
    (first load only) are the grader's, e.g. a task whose items are few enough to enumerate."""
    rt = runtime()
    spec = parse_benchmark(doc)

    def existing() -> BenchmarkOut | None:
        with rt.db.session() as s:
            b = s.scalar(select(Benchmark).where(Benchmark.name == spec.name))
            if b is not None and BenchmarkFile.model_validate(b.spec) != spec:
                raise Conflict(f"benchmark {spec.name!r} exists with a different definition; choose a new name", field="name")
            return None if b is None else _benchmark_out(b)

    if (out := await run_in_threadpool(existing)) is not None:
        return out
    bm_id = new_id("bm")
    tasks = spec.task_list()
    ids = {t.name: bm_id if spec.tasks is None else new_id("bm") for t in tasks}  # the grader grades each task as its own benchmark
    warnings: list[str] = []
    for t in tasks:
        grading = grading_spec(spec, t, ids[t.name])
        warnings += (await rt.grader.post("/internal/benchmarks", json=grading.model_dump(mode="json"))).get("warnings", [])

    def store() -> BenchmarkOut:
        with rt.db.session() as s:
            b = Benchmark(id=bm_id, name=spec.name, spec=spec.model_dump(mode="json"), tasks=ids, created_at=utcnow())
            s.add(b)
            s.flush()
            return _benchmark_out(b, warnings)

    return await run_in_threadpool(store)


async def benchmark_baselines(ref: str) -> dict[str, Any]:
    """The grader's status of a benchmark (by id or name): split sizes and baseline test scores, per task under
    ``tasks``; with one task also at the top level. ``initial_status``/``reference_status`` sum the tasks up:
    ``succeeded`` once all have, ``failed`` if one has, else ``running``."""
    def task_ids() -> dict[str, str]:
        with runtime().db.session() as s:
            return _find_benchmark(s, ref).task_ids()

    tasks = {name: await runtime().grader.get(f"/internal/benchmarks/{gid}") for name, gid in (await run_in_threadpool(task_ids)).items()}
    if len(tasks) == 1:
        return {**next(iter(tasks.values())), "tasks": tasks}

    def overall(key: str) -> str | None:
        states = {t[key] for t in tasks.values()}
        done = {None, "declared", "succeeded"}
        return "failed" if "failed" in states else ("succeeded" if states <= done else "running")

    return {"tasks": tasks, "initial_status": overall("initial_status"), "reference_status": overall("reference_status")}


def list_benchmarks() -> list[BenchmarkOut]:
    with runtime().db.session() as s:
        return [_benchmark_out(b) for b in s.scalars(select(Benchmark).order_by(Benchmark.id))]


def _find_benchmark(s: Any, ref: str) -> Benchmark:
    b = s.get(Benchmark, ref) if has_prefix(ref, "bm") else s.scalar(select(Benchmark).where(Benchmark.name == ref))
    if b is None:
        raise NotFound(f"benchmark {ref!r} not found", field="benchmark")
    return b


# --------------------------------------------------------------------------- runs and keys (operators)


def _run_out(r: Run) -> RunOut:
    return RunOut(id=r.id, benchmark_id=r.benchmark_id, agent_name=r.agent_name, track=r.track, key_prefix=r.key_prefix,
                  budget_usd_micros=r.budget_usd_micros, deadline_at=r.deadline_at, revoked=r.revoked_at is not None, created_at=r.created_at)


async def create_run(req: RunCreate) -> RunCreated:
    """Create a run with a ledger account and a fresh API key (returned once; only its hash is stored)."""
    rt = runtime()

    def find() -> tuple[Benchmark, BenchmarkFile]:
        with rt.db.session() as s:
            b = _find_benchmark(s, req.benchmark)
            return b, BenchmarkFile.model_validate(b.spec)

    b, spec = await run_in_threadpool(find)
    budget = round(req.budget_usd * 1_000_000) if req.budget_usd else spec.budget.usd_micros
    hours = req.wall_clock_hours or spec.budget.wall_clock_hours
    run_id = new_id("run")
    key = new_secret("crk")
    await rt.ledger.post("/internal/accounts", json={"account_id": run_id, "budget_usd_micros": budget})

    def store() -> RunCreated:
        now = utcnow()
        with rt.db.session() as s:
            r = Run(id=run_id, benchmark_id=b.id, agent_name=req.agent_name, track=req.track or spec.track, key_hash=hash_secret(key),
                    key_prefix=key[:8], budget_usd_micros=budget, deadline_at=now + dt.timedelta(hours=hours), created_at=now)
            s.add(r)
            s.flush()
            return RunCreated(**_run_out(r).model_dump(), api_key=key)

    return await run_in_threadpool(store)


def list_runs() -> list[RunOut]:
    with runtime().db.session() as s:
        return [_run_out(r) for r in s.scalars(select(Run).order_by(Run.id))]


def revoke_run_key(run_id: str) -> RunOut:
    """Revoke a run's key; the next request with it gets 401."""
    with runtime().db.session() as s:
        r = s.get(Run, run_id)
        if r is None:
            raise NotFound(f"run {run_id} not found")
        r.revoked_at = r.revoked_at or utcnow()
        return _run_out(r)


def _require_run(run_id: str) -> None:
    with runtime().db.session() as s:
        if s.get(Run, run_id) is None:
            raise NotFound(f"run {run_id} not found", field="run_id")


async def ledger_entries(run_id: str, after: str | None, limit: int) -> list[dict]:
    """Run ``run_id``'s ledger entries (``NotFound`` for an unknown run or ``after`` entry)."""
    await run_in_threadpool(_require_run, run_id)
    return await runtime().ledger.get(f"/internal/accounts/{run_id}/entries", params={"limit": limit} | ({"after": after} if after else {}))


async def refund(run_id: str, req: RefundRequest) -> dict:
    """Refund (part of) charge ``req.entry_id`` of run ``run_id`` through the ledger; the ledger's refund.

    ``NotFound`` for an unknown run (or a charge that is not the run's); the ledger's 409s pass through.
    """
    await run_in_threadpool(_require_run, run_id)
    return await runtime().ledger.post("/internal/refunds", json={"account_id": run_id, **req.model_dump(exclude_none=True)})


# --------------------------------------------------------------------------- agent authorization


def bearer_key(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; ``None`` for another scheme or no key."""
    scheme, _, key = (authorization or "").partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


def authenticate(authorization: str | None) -> Caller:
    """The caller behind ``Authorization: Bearer <run key>``; ``Unauthorized`` if missing, unknown or revoked (blocking: a database read)."""
    key = bearer_key(authorization)
    if key is None:
        raise Unauthorized("send the run's API key as `Authorization: Bearer <key>`")
    with runtime().db.session() as s:
        run = s.scalar(select(Run).where(Run.key_hash == hash_secret(key)))
        if run is None:
            raise Unauthorized("unknown API key")
        if run.revoked_at is not None:
            raise Unauthorized("this API key has been revoked")
        bm = s.get(Benchmark, run.benchmark_id)
        spec, tasks = BenchmarkFile.model_validate(bm.spec), bm.task_ids()  # type: ignore[union-attr]
    editable = list(spec.editable or []) if run.track == spec.track else list(TRACKS[run.track])  # a run on another track than the file's
    ctx = RunContext(run_id=run.id, task_id=next(iter(tasks.values())), track=run.track, editable=editable)
    return Caller(run=run, benchmark=spec, ctx=ctx, tasks=tasks)


def for_task(caller: Caller, task: str | None) -> Caller:
    """The caller scoped to ``task`` (its grader id in ``ctx.task_id``); ``task`` may be omitted when the
    benchmark has one. ``Unprocessable`` (field ``task``) when it is unknown, or missing with several tasks."""
    if task is None:
        if len(caller.tasks) > 1:
            raise Unprocessable(f"this benchmark has several tasks ({', '.join(caller.tasks)}): name one with ?task=", field="task")
        return caller
    if task not in caller.tasks:
        raise Unprocessable(f"unknown task {task!r}; this benchmark's tasks: {', '.join(caller.tasks)}", field="task")
    return dataclasses.replace(caller, ctx=caller.ctx.model_copy(update={"benchmark_id": caller.tasks[task]}))


def check_deadline(caller: Caller) -> None:
    """``RunExpired`` (403 ``run_expired``) if the run's wall-clock deadline has passed."""
    if utcnow() >= caller.run.deadline_at:
        raise RunExpired(f"run {caller.run.id} ended at {caller.run.deadline_at.isoformat()}; read-only calls still work")


def check_editable(caller: Caller, part: str, operation: str) -> None:
    """``OutsideEditableSpace`` unless ``part`` (data|trainer|harness) is in the run's editable space."""
    if part not in caller.ctx.editable:
        raise OutsideEditableSpace(f"{operation} needs the {part!r} part editable; track {caller.run.track!r} allows {caller.ctx.editable}", operation=operation)


def apply_recipe_policy(caller: Caller, sent: dict[str, Any]) -> dict[str, Any]:
    """The recipe to run: fields the agent sent, checked against the benchmark's allow/lock, plus locked values.

    A locked field sent with a different value, a field outside ``allow``, or any field at all when the
    trainer is not editable → ``OutsideEditableSpace`` naming ``recipe.<field>``. Never silently overwritten.
    """
    policy = caller.benchmark.recipe
    defaults = Recipe().model_dump()
    for name, value in sent.items():
        if name not in TRAINING_FIELDS:
            continue  # the trainer's schema rejects unknown fields with 422
        if name in policy.lock:
            if value != policy.lock[name]:
                raise OutsideEditableSpace(f"recipe.{name} is locked to {policy.lock[name]!r} by this benchmark", field=f"recipe.{name}")
            continue
        if "trainer" not in caller.ctx.editable and value != defaults[name]:
            raise OutsideEditableSpace(f"recipe.{name}: the trainer is not editable on track {caller.run.track!r}", field=f"recipe.{name}")
        if policy.allow != "all" and name not in policy.allow:
            raise OutsideEditableSpace(f"recipe.{name} is not among the benchmark's allowed fields {policy.allow}", field=f"recipe.{name}")
    return {**sent, **policy.lock}


# --------------------------------------------------------------------------- run card, budget


async def budget(caller: Caller) -> BudgetOut:
    bal = await runtime().ledger.get(f"/internal/accounts/{caller.run.id}")
    return BudgetOut(**{k: bal[k] for k in BudgetOut.model_fields})


async def run_card(caller: Caller) -> RunCard:
    """The run card: the benchmark (each task with its suite, split sizes, initial system and reference; a
    one-task benchmark's task also at the top level), track, recipe policy, evaluation settings, deadline,
    budget and every limit with what is left (``final_submissions`` counts per task the submissions that are used up:
    all but those whose grading failed by the platform's fault)."""
    rt = runtime()
    spec = caller.benchmark
    subs = (await rt.grader.get("/internal/submissions", ctx=caller.ctx))["data"]
    tasks = []
    for t in spec.task_list():
        grading = await rt.grader.get(f"/internal/benchmarks/{caller.tasks[t.name]}")
        tasks.append({"name": t.name, "suite": t.suite.name, "params": t.suite.params, "validation_items": t.suite.splits.validation.size,
                      "test_items": t.suite.splits.test.size, "initial_system": grading["initial_system"],
                      "reference": t.reference.model_dump(exclude={"system"}), "evaluation": t.evaluation.model_dump()})
    benchmark = {"id": caller.run.benchmark_id, "name": spec.name, "description": spec.description, "tasks": tasks}
    if len(tasks) == 1:
        benchmark |= {k: v for k, v in tasks[0].items() if k != "name"}
    left = int((caller.run.deadline_at - utcnow()).total_seconds())
    usage = EvaluationUsage(**await rt.grader.get("/internal/evaluations/usage", ctx=caller.ctx))
    return RunCard(
        run_id=caller.run.id, agent_name=caller.run.agent_name, benchmark=benchmark,
        track=caller.run.track, editable=caller.ctx.editable, recipe=spec.recipe, evaluation=spec.evaluation,
        deadline_at=caller.run.deadline_at, seconds_left=max(0, left), budget=await budget(caller),
        limits=_limits_left(spec, {t["name"]: sum(1 for x in subs if x["task"] == t["name"] and x["counted"]) for t in tasks}, usage),
    )


def _limits_left(spec: BenchmarkFile, submissions: dict[str, int], usage: EvaluationUsage) -> dict[str, Any]:
    """Each limit of the benchmark with what the run has used and has left (``None``: no limit).

    ``submissions``: final submissions used up per task. With several tasks, ``final_submissions`` sums the
    tasks up and ``final_submissions_by_task`` gives each task's own row."""
    lim = spec.limits

    def row(limit: int | None, used: int) -> dict[str, int | None]:
        return {"limit": limit, "used": used, "left": None if limit is None else max(0, limit - used)}

    by_task = {task: row(lim.final_submissions, used) for task, used in submissions.items()}
    out: dict[str, Any] = {
        "final_submissions": row(lim.final_submissions * len(by_task), sum(submissions.values())),
        "validation_evaluations_per_hour": row(lim.validation_evaluations_per_hour, usage.last_hour),
        "validation_evaluations_per_day": row(lim.validation_evaluations_per_day, usage.last_day),
        "concurrent_evaluations": row(lim.concurrent_evaluations, usage.active),
        "failed_evaluations": row(lim.failed_evaluations, usage.failed),
        "validation_evaluations_total": usage.total,
    }
    if len(by_task) > 1:
        out["final_submissions_by_task"] = by_task
    return out


# --------------------------------------------------------------------------- episode log


def log_call(run_id: str, method: str, path: str, status: int, latency_ms: int) -> None:
    with runtime().db.session() as s:
        s.add(EpisodeEvent(run_id=run_id, method=method, path=path, status=status, latency_ms=latency_ms, created_at=utcnow()))


def log_audit(actor: str, key_prefix: str | None, method: str, path: str, status: int, client: str | None) -> None:
    """Append an operator action or a refused credential to the audit log."""
    with runtime().db.session() as s:
        s.add(AuditEvent(actor=actor, key_prefix=key_prefix, method=method, path=path, status=status, client=client, created_at=utcnow()))


def audit_log(after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    """Audit events with ``seq > after``, oldest first."""
    with runtime().db.session() as s:
        rows = s.scalars(select(AuditEvent).where(AuditEvent.seq > after).order_by(AuditEvent.seq).limit(limit))
        return [{"seq": e.seq, "actor": e.actor, "key_prefix": e.key_prefix, "method": e.method, "path": e.path, "status": e.status,
                 "client": e.client, "created_at": e.created_at} for e in rows]


def episode_log(run_id: str, after: int = 0, limit: int = 1000) -> list[dict[str, Any]]:
    with runtime().db.session() as s:
        rows = s.scalars(select(EpisodeEvent).where(EpisodeEvent.run_id == run_id, EpisodeEvent.seq > after).order_by(EpisodeEvent.seq).limit(limit))
        return [{"seq": e.seq, "method": e.method, "path": e.path, "status": e.status, "latency_ms": e.latency_ms, "created_at": e.created_at} for e in rows]


# --------------------------------------------------------------------------- leaderboard


async def leaderboard() -> list[LeaderboardRow]:
    """One row per run with a final submission, ranked by final test score (Avg over tasks) within each benchmark.

    Per task, the run's latest graded submission counts (a later one queued, running or failed leaves the row as it
    was; until one is graded, the latest one shows its status; the grader picks it, ``leaderboard_entries``).
    Gap closed = (final − initial) / (reference − initial), with initial and reference scored by the grader on
    the same hidden split (or the reference score the benchmark declares). Over tasks: Avg = mean of the finals, gap closed = mean of the tasks' gaps, RSI-Index = mean of
    (final − initial) / (1 − initial) (RSIGym's definition).
    """
    rt = runtime()
    entries = (await rt.grader.get("/internal/leaderboard"))["data"]

    def read() -> tuple[dict[str, Run], dict[str, Benchmark]]:
        with rt.db.session() as s:
            return {r.id: r for r in s.scalars(select(Run))}, {b.id: b for b in s.scalars(select(Benchmark))}

    runs, benchmarks = await run_in_threadpool(read)
    counting: dict[str, dict[str, dict[str, Any]]] = {}  # run -> grader benchmark id (task) -> the submission that counts
    for e in entries:
        counting.setdefault(e["run_id"], {})[e["benchmark_id"]] = e
    baselines: dict[str, dict[str, Any]] = {}
    rows: list[LeaderboardRow] = []
    for run_id, by_task in counting.items():
        run = runs.get(run_id)
        if run is None:
            continue
        bm = benchmarks[run.benchmark_id]
        tasks = []
        for name, gid in bm.task_ids().items():
            if gid not in baselines:
                baselines[gid] = await rt.grader.get(f"/internal/benchmarks/{gid}")
            tasks.append(_task_score(name, baselines[gid], by_task.get(gid)))
        graded = [t for t in tasks if t.final_score is not None]
        all_graded = len(graded) == len(tasks)
        ends = [dt.datetime.fromisoformat(e["graded_at"]) for e in by_task.values() if e.get("graded_at")]
        end = max(ends) if all_graded and ends else utcnow()
        contamination = [t.contaminated for t in tasks if t.contaminated is not None]
        one = tasks[0] if len(tasks) == 1 else None
        rows.append(LeaderboardRow(
            rank=None, run_id=run.id, benchmark=bm.name, agent_name=run.agent_name, tasks=tasks,
            status="graded" if all_graded else _least_advanced([t.status for t in tasks]),
            submission_id=one.submission_id if one else None,
            initial_score=_mean([t.initial_score for t in tasks]), final_score=_mean([t.final_score for t in tasks]) if all_graded else None,
            reference_score=_mean([t.reference_score for t in tasks]), gap_closed=_mean([t.gap_closed for t in tasks]) if all_graded else None,
            rsi_index=_mean([_rsi_term(t) for t in tasks]) if all_graded else None,
            n=sum(t.n or 0 for t in tasks) if graded else None, final_ci=one.final_ci if one else None,
            contaminated=any(contamination) if contamination else None,
            validation_evaluations=max(e["validation_evaluations"] for e in by_task.values()),
            spent_usd=(await rt.ledger.get(f"/internal/accounts/{run.id}"))["spent_usd_micros"] / 1_000_000,
            elapsed_hours=(end - run.created_at).total_seconds() / 3600,
        ))
    for name in {r.benchmark for r in rows}:
        ranked = sorted((r for r in rows if r.benchmark == name and r.final_score is not None), key=lambda r: -r.final_score)  # type: ignore[operator]
        for i, r in enumerate(ranked, start=1):
            r.rank = i
    rows.sort(key=lambda r: (r.benchmark, r.rank or 10**9))
    return rows


def _task_score(task: str, baseline: dict[str, Any], entry: dict[str, Any] | None) -> TaskScore:
    """One task's line: baselines from the grader's benchmark status, the final from the submission that counts."""
    initial = baseline["initial"]["value"] if baseline.get("initial") else None
    reference = baseline["reference"]["value"] if baseline.get("reference") else None
    score = (entry or {}).get("score")
    final = score["value"] if score else None
    gap = (final - initial) / (reference - initial) if None not in (initial, reference, final) and reference != initial else None  # type: ignore[operator]
    audit = (entry or {}).get("contamination") or {}
    return TaskScore(
        task=task, submission_id=entry["submission_id"] if entry else None, status=entry["status"] if entry else "not submitted",
        initial_score=initial, final_score=final, reference_score=reference, gap_closed=gap, n=score["n"] if score else None,
        final_ci=(score["ci_low"], score["ci_high"]) if score and score.get("ci_low") is not None else None,
        contaminated=audit.get("contaminated"),
    )


def _rsi_term(t: TaskScore) -> float | None:
    """(final − initial) / (1 − initial); ``None`` when a score is missing or the initial system is already perfect."""
    if t.final_score is None or t.initial_score is None or t.initial_score >= 1.0:
        return None
    return (t.final_score - t.initial_score) / (1.0 - t.initial_score)


def _mean(values: list[float | None]) -> float | None:
    """Mean of ``values``; ``None`` if any is missing."""
    return None if not values or any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type,misc]


def _least_advanced(statuses: list[str]) -> str:
    order = ["not submitted", "failed", "queued", "running", "graded"]
    return min(statuses, key=lambda x: order.index(x) if x in order else 0)
