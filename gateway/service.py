"""Gateway logic: benchmarks, runs and keys, the run's permissions and deadline, forwarding, leaderboard.

Every agent call is authorized here (run key → run), checked against the run's deadline and editable
space, then forwarded to the owning service with the signed run context. Internal services' problem+json
answers pass through unchanged.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import select

from gateway.models import AuditEvent, Benchmark, EpisodeEvent, Run
from gateway.ratelimit import KeyRateLimiter
from gateway.schemas import BenchmarkFile, BenchmarkOut, BudgetOut, LeaderboardRow, RefundRequest, RunCard, RunCreate, RunCreated, RunOut
from gateway.settings import GatewaySettings
from services.common.auth import RunContext, hash_secret, new_secret
from services.common.contracts import TRAINING_FIELDS, EvaluationUsage, GradingSpec, Recipe
from services.common.db import Database, utcnow
from services.common.errors import Conflict, NotFound, OutsideEditableSpace, RunExpired, Unauthorized, Unprocessable
from services.common.http import ServiceClient, ledger_client
from services.common.ids import has_prefix, new_id
from services.common.lazy import once


@dataclass
class Runtime:
    settings: GatewaySettings
    db: Database
    ledger: ServiceClient
    trainer: ServiceClient
    inference: ServiceClient
    grader: ServiceClient
    limiter: KeyRateLimiter


@once
def runtime() -> Runtime:
    s = GatewaySettings()
    def client(url: str, name: str, timeout_s: float | None = None) -> ServiceClient:
        return ServiceClient(url, s.service_token, name=name, timeout_s=timeout_s or s.http_timeout_s)
    return Runtime(
        settings=s, db=Database(s.database_url_for("gateway")),
        ledger=ledger_client(s), trainer=client(s.trainer_url, "trainer", 120),
        inference=client(s.inference_url, "inference", 300), grader=client(s.grader_url, "grader", 300),
        limiter=KeyRateLimiter(s.rate_limits, s.rate_limit_storage),
    )


@dataclass(frozen=True)
class Caller:
    """An authenticated agent call: its run, its benchmark file, and the context sent to services."""

    run: Run
    benchmark: BenchmarkFile
    ctx: RunContext


# --------------------------------------------------------------------------- benchmarks (operators)


def _benchmark_out(b: Benchmark) -> BenchmarkOut:
    return BenchmarkOut(id=b.id, name=b.name, spec=BenchmarkFile.model_validate(b.spec), created_at=b.created_at)


def parse_benchmark(doc: Any) -> BenchmarkFile:
    """Validate a benchmark document; raises ``Unprocessable`` naming the key path and the reason."""
    try:
        return BenchmarkFile.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(document)"
        raise Unprocessable(f"{field}: {err['msg']}", field=field) from exc


def load_benchmark(doc: Any) -> BenchmarkOut:
    """Register a benchmark: validate, have the grader build its splits, store it. Same name and same
    document → the existing benchmark; same name, different document → ``Conflict``."""
    rt = runtime()
    spec = parse_benchmark(doc)
    with rt.db.session() as s:
        existing = s.scalar(select(Benchmark).where(Benchmark.name == spec.name))
        if existing is not None:
            if BenchmarkFile.model_validate(existing.spec) != spec:
                raise Conflict(f"benchmark {spec.name!r} exists with a different definition; choose a new name", field="name")
            return _benchmark_out(existing)
    bm_id = new_id("bm")
    grading = GradingSpec(
        benchmark_id=bm_id, suite=spec.suite, initial_system=spec.initial_system, reference_system=spec.reference.system,
        reference_score=spec.reference.score, evaluation=spec.evaluation,
    )
    rt.grader.post("/internal/benchmarks", json=grading.model_dump(mode="json"))
    with rt.db.session() as s:
        b = Benchmark(id=bm_id, name=spec.name, spec=spec.model_dump(mode="json"), created_at=utcnow())
        s.add(b)
        s.flush()
        return _benchmark_out(b)


def benchmark_baselines(ref: str) -> dict[str, Any]:
    """The grader's status of a benchmark (by id or name): split sizes and baseline test scores."""
    with runtime().db.session() as s:
        bm_id = _find_benchmark(s, ref).id
    return runtime().grader.get(f"/internal/benchmarks/{bm_id}")


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


def create_run(req: RunCreate) -> RunCreated:
    """Create a run with a ledger account and a fresh API key (returned once; only its hash is stored)."""
    rt = runtime()
    with rt.db.session() as s:
        b = _find_benchmark(s, req.benchmark)
        spec = BenchmarkFile.model_validate(b.spec)
    budget = round(req.budget_usd * 1_000_000) if req.budget_usd else spec.budget.usd_micros
    hours = req.wall_clock_hours or spec.budget.wall_clock_hours
    run_id = new_id("run")
    key = new_secret("crk")
    rt.ledger.post("/internal/accounts", json={"account_id": run_id, "budget_usd_micros": budget})
    now = utcnow()
    with rt.db.session() as s:
        r = Run(id=run_id, benchmark_id=b.id, agent_name=req.agent_name, track=spec.track, key_hash=hash_secret(key), key_prefix=key[:8],
                budget_usd_micros=budget, deadline_at=now + dt.timedelta(hours=hours), created_at=now)
        s.add(r)
        s.flush()
        return RunCreated(**_run_out(r).model_dump(), api_key=key)


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


def ledger_entries(run_id: str, after: str | None, limit: int) -> list[dict]:
    """Run ``run_id``'s ledger entries (``NotFound`` for an unknown run or ``after`` entry)."""
    _require_run(run_id)
    return runtime().ledger.get(f"/internal/accounts/{run_id}/entries", params={"limit": limit} | ({"after": after} if after else {}))


def refund(run_id: str, req: RefundRequest) -> dict:
    """Refund (part of) charge ``req.entry_id`` of run ``run_id`` through the ledger; the ledger's refund.

    ``NotFound`` for an unknown run (or a charge that is not the run's); the ledger's 409s pass through.
    """
    _require_run(run_id)
    return runtime().ledger.post("/internal/refunds", json={"account_id": run_id, **req.model_dump(exclude_none=True)})


# --------------------------------------------------------------------------- agent authorization


def authenticate(authorization: str | None) -> Caller:
    """The caller behind ``Authorization: Bearer <run key>``; ``Unauthorized`` if missing, unknown or revoked."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key:
        raise Unauthorized("send the run's API key as `Authorization: Bearer <key>`")
    with runtime().db.session() as s:
        run = s.scalar(select(Run).where(Run.key_hash == hash_secret(key.strip())))
        if run is None:
            raise Unauthorized("unknown API key")
        if run.revoked_at is not None:
            raise Unauthorized("this API key has been revoked")
        spec = BenchmarkFile.model_validate(s.get(Benchmark, run.benchmark_id).spec)  # type: ignore[union-attr]
    ctx = RunContext(run_id=run.id, benchmark_id=run.benchmark_id, track=run.track, editable=list(spec.editable or []))
    return Caller(run=run, benchmark=spec, ctx=ctx)


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


def budget(caller: Caller) -> BudgetOut:
    bal = runtime().ledger.get(f"/internal/accounts/{caller.run.id}")
    return BudgetOut(**{k: bal[k] for k in BudgetOut.model_fields})


def run_card(caller: Caller) -> RunCard:
    spec = caller.benchmark
    subs = runtime().grader.get("/internal/submissions", ctx=caller.ctx)["data"]
    grading = runtime().grader.get(f"/internal/benchmarks/{caller.run.benchmark_id}")
    left = int((caller.run.deadline_at - utcnow()).total_seconds())
    return RunCard(
        run_id=caller.run.id, agent_name=caller.run.agent_name,
        benchmark={"id": caller.run.benchmark_id, "name": spec.name, "description": spec.description, "suite": spec.suite.name,
                   "params": spec.suite.params, "validation_items": spec.suite.splits.validation.size, "test_items": spec.suite.splits.test.size,
                   "initial_system": grading["initial_system"], "reference": spec.reference.model_dump(exclude={"system"})},
        track=caller.run.track, editable=caller.ctx.editable, recipe=spec.recipe, evaluation=spec.evaluation,
        deadline_at=caller.run.deadline_at, seconds_left=max(0, left), budget=budget(caller),
        limits=_limits_left(spec, len(subs), EvaluationUsage(**runtime().grader.get("/internal/evaluations/usage", ctx=caller.ctx))),
    )


def _limits_left(spec: BenchmarkFile, submissions: int, usage: EvaluationUsage) -> dict[str, Any]:
    """Each limit of the benchmark with what the run has used and has left (``None``: no limit)."""
    lim = spec.limits

    def row(limit: int | None, used: int) -> dict[str, int | None]:
        return {"limit": limit, "used": used, "left": None if limit is None else max(0, limit - used)}

    return {
        "final_submissions": row(lim.final_submissions, submissions),
        "validation_evaluations_per_hour": row(lim.validation_evaluations_per_hour, usage.last_hour),
        "validation_evaluations_per_day": row(lim.validation_evaluations_per_day, usage.last_day),
        "concurrent_evaluations": row(lim.concurrent_evaluations, usage.active),
        "failed_evaluations": row(lim.failed_evaluations, usage.failed),
        "validation_evaluations_total": usage.total,
    }


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


def leaderboard() -> list[LeaderboardRow]:
    """One row per final submission, ranked by final test score within each benchmark.

    gap closed = (final − initial) / (reference − initial), with initial and reference scored by the grader
    on the same hidden split (or the reference score the benchmark declares).
    """
    rt = runtime()
    entries = rt.grader.get("/internal/leaderboard")["data"]
    with rt.db.session() as s:
        runs = {r.id: r for r in s.scalars(select(Run))}
        benchmarks = {b.id: b for b in s.scalars(select(Benchmark))}
    baselines: dict[str, dict[str, Any]] = {}
    rows: list[LeaderboardRow] = []
    for e in entries:
        run = runs.get(e["run_id"])
        if run is None:
            continue
        bm_id = e["benchmark_id"]
        if bm_id not in baselines:
            baselines[bm_id] = rt.grader.get(f"/internal/benchmarks/{bm_id}")
        base = baselines[bm_id]
        initial = base["initial"]["value"] if base.get("initial") else None
        reference = base["reference"]["value"] if base.get("reference") else None
        final = e["score"]["value"] if e.get("score") else None
        gap = None
        if None not in (initial, reference, final) and reference != initial:
            gap = (final - initial) / (reference - initial)
        spent = rt.ledger.get(f"/internal/accounts/{run.id}")["spent_usd_micros"]
        end = dt.datetime.fromisoformat(e["graded_at"]) if e.get("graded_at") else utcnow()
        rows.append(LeaderboardRow(
            rank=None, run_id=run.id, benchmark=benchmarks[bm_id].name, agent_name=run.agent_name, submission_id=e["submission_id"],
            status=e["status"], initial_score=initial, final_score=final, reference_score=reference, gap_closed=gap,
            n=e["score"]["n"] if e.get("score") else None, validation_evaluations=e["validation_evaluations"],
            final_ci=(e["score"]["ci_low"], e["score"]["ci_high"]) if e.get("score") and e["score"].get("ci_low") is not None else None,
            spent_usd=spent / 1_000_000, elapsed_hours=(end - run.created_at).total_seconds() / 3600,
        ))
    for name in {r.benchmark for r in rows}:
        graded = sorted((r for r in rows if r.benchmark == name and r.final_score is not None), key=lambda r: -r.final_score)  # type: ignore[operator]
        for i, r in enumerate(graded, start=1):
            r.rank = i
    rows.sort(key=lambda r: (r.benchmark, r.rank or 10**9))
    return rows
