"""Runs: created and revoked by operators, with their ledger accounts; the run card and budget their agents read.

A run's money lives in the ledger (an account per run, opened with the run); the gateway keeps the run, its
hashed key, track and deadline.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.benchmarks import require_ready
from gateway.models import Benchmark, Run
from gateway.schemas import BenchmarkFile, BudgetOut, RefundRequest, RunCard, RunCreate, RunCreated, RunOut
from gateway.service import Caller, Gateway
from services.common.auth import hash_secret, new_secret
from services.common.contracts import EvaluationUsage
from services.common.db import utcnow
from services.common.errors import Unprocessable
from services.common.ids import new_id
from services.ledger.schemas import AccountCreate, Entry, Refund, RefundCreate


def run_out(r: Run) -> RunOut:
    return RunOut(id=r.id, benchmark_id=r.benchmark_id, agent_name=r.agent_name, track=r.track, key_prefix=r.key_prefix,
                  budget_usd_micros=r.budget_usd_micros, deadline_at=r.deadline_at, revoked=r.revoked_at is not None, created_at=r.created_at)


# --------------------------------------------------------------------------- operators


async def create_run(gw: Gateway, req: RunCreate) -> RunCreated:
    """Create a run with a ledger account and a fresh API key (returned once; only its hash is stored).
    ``NotFound`` for an unknown benchmark, ``BenchmarkNotReady`` (409) for one whose splits are still being built or
    failed to build."""

    def find() -> tuple[Benchmark, BenchmarkFile]:
        with gw.db.session() as s:
            b = repository.find_benchmark(s, req.benchmark)
            return b, BenchmarkFile.model_validate(b.spec)

    b, spec = await run_in_threadpool(find)
    await require_ready(gw, b)
    if req.track is not None and "evaluator" in (req.track, spec.track) and req.track != spec.track:
        raise Unprocessable(f"track: a run of {spec.name!r} ({spec.track} track) cannot be on the {req.track} track: the evaluator track's "
                            "benchmarks have candidates and targets, the others tasks to improve", field="track")
    budget = round(req.budget_usd * 1_000_000) if req.budget_usd else spec.budget.usd_micros
    hours = req.wall_clock_hours or spec.budget.wall_clock_hours
    run_id = new_id("run")
    key = new_secret("crk")
    await gw.ledger.open_account(AccountCreate(account_id=run_id, budget_usd_micros=budget))

    def store() -> RunCreated:
        now = utcnow()
        with gw.db.session() as s:
            r = repository.add_run(s, run_id, benchmark_id=b.id, agent_name=req.agent_name, track=req.track or spec.track, key_hash=hash_secret(key),
                                   key_prefix=key[:8], budget_usd_micros=budget, deadline_at=now + dt.timedelta(hours=hours), created_at=now)
            return RunCreated(**run_out(r).model_dump(), api_key=key)

    return await run_in_threadpool(store)


def list_runs(gw: Gateway) -> list[RunOut]:
    with gw.db.session() as s:
        return [run_out(r) for r in repository.runs(s)]


def revoke_run_key(gw: Gateway, run_id: str) -> RunOut:
    """Revoke a run's key; the next request with it gets 401. ``NotFound`` for an unknown run."""
    with gw.db.session() as s:
        r = repository.run(s, run_id)
        r.revoked_at = r.revoked_at or utcnow()
        return run_out(r)


def _require_run(gw: Gateway, run_id: str) -> None:
    with gw.db.session() as s:
        repository.run(s, run_id, field="run_id")


async def ledger_entries(gw: Gateway, run_id: str, after: str | None, limit: int) -> list[Entry]:
    """Run ``run_id``'s ledger entries (``NotFound`` for an unknown run or ``after`` entry)."""
    await run_in_threadpool(_require_run, gw, run_id)
    return await gw.ledger.list_entries(run_id, after=after, limit=limit)


async def refund(gw: Gateway, run_id: str, req: RefundRequest) -> Refund:
    """Refund (part of) charge ``req.entry_id`` of run ``run_id`` through the ledger; the ledger's refund.

    ``NotFound`` for an unknown run (or a charge that is not the run's); the ledger's 409s pass through.
    """
    await run_in_threadpool(_require_run, gw, run_id)
    return await gw.ledger.create_refund(RefundCreate(account_id=run_id, **req.model_dump(exclude_none=True)))


# --------------------------------------------------------------------------- the run's agent


async def budget(gw: Gateway, caller: Caller) -> BudgetOut:
    """The run's balance in the ledger."""
    return BudgetOut.model_validate(await gw.ledger.get_balance(caller.run.id), from_attributes=True)


async def run_card(gw: Gateway, caller: Caller) -> RunCard:
    """The run card: the benchmark (each task with its suite, split sizes, initial system and reference; a
    one-task benchmark's task also at the top level), track, recipe policy, evaluation settings, deadline,
    budget and every limit with what is left (``final_submissions`` counts per task the submissions that are used up:
    all but those whose grading failed by the platform's fault)."""
    spec = caller.benchmark
    subs = (await gw.grader.list_submissions(ctx=caller.ctx)).data
    tasks = []
    evaluator_track = spec.track == "evaluator"
    for t in spec.task_list():
        task: dict[str, Any] = {"name": t.name, "suite": t.suite.name, "params": t.suite.params, "validation_items": t.suite.splits.validation.size,
                                "test_items": t.suite.splits.test.size, "evaluation": t.evaluation.model_dump() if t.evaluation else None}
        if evaluator_track:  # a candidate's system is never shown: only its opaque name
            task["target"] = t.target
        else:
            grading = await gw.grader.task_status(caller.tasks[t.name])
            task |= {"initial_system": grading.initial_system.model_dump(mode="json"),
                     "reference": t.reference.model_dump(exclude={"system"}) if t.reference else None}
        tasks.append(task)
    benchmark = {"id": caller.run.benchmark_id, "name": spec.name, "description": spec.description, "tasks": tasks}
    if evaluator_track:
        benchmark |= {"candidates": [f"candidate-{i:02d}" for i in range(1, len(spec.candidates or []) + 1)],
                      "evaluator": spec.evaluator.model_dump() if spec.evaluator else None}
    if len(tasks) == 1:
        benchmark |= {k: v for k, v in tasks[0].items() if k != "name"}
    left = int((caller.run.deadline_at - utcnow()).total_seconds())
    usage = await gw.grader.evaluation_usage(ctx=caller.ctx)
    return RunCard(
        run_id=caller.run.id, agent_name=caller.run.agent_name, benchmark=benchmark,
        track=caller.run.track, editable=caller.ctx.editable, recipe=spec.recipe, evaluation=spec.evaluation,
        deadline_at=caller.run.deadline_at, seconds_left=max(0, left), budget=await budget(gw, caller),
        limits=_limits_left(spec, {t["name"]: sum(1 for x in subs if x.task == t["name"] and x.counted) for t in tasks
                                   if not t.get("target")}, usage),  # a target takes no submission
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
