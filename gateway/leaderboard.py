"""The public leaderboard: per run, its final submissions on each task of its benchmark, scored and ranked.

The grader says which submission of each run and task counts and its aggregate test score
(``GraderClient.leaderboard``) and each task's baselines (``task_status``); the ledger says what the run spent.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.models import Benchmark, Run
from gateway.schemas import EVALUATOR_TASK, LeaderboardRow, TaskScore
from gateway.service import Gateway
from grader.schemas import LeaderboardEntry
from services.common.contracts import GradingTaskStatus
from services.common.db import utcnow


async def leaderboard(gw: Gateway) -> list[LeaderboardRow]:
    """One row per run with a final submission, ranked by final test score (Avg over tasks) within each benchmark.

    Per task, the run's latest graded submission counts (a later one queued, running or failed leaves the row as it
    was; until one is graded, the latest one shows its status; the grader picks it).
    Gap closed = (final − initial) / (reference − initial), with initial and reference scored by the grader on
    the same hidden split (or the reference score the benchmark declares). Over tasks: Avg = mean of the finals, gap closed = mean of the tasks' gaps, RSI-Index = mean of
    (final − initial) / (1 − initial) (RSIGym's definition). On the evaluator track a row is its frozen evaluator's
    (the track's own task): final = mean pairwise agreement with the sealed targets, and its grade in ``evaluator``.
    """
    entries = (await gw.grader.leaderboard()).data

    def read() -> tuple[dict[str, Run], dict[str, Benchmark]]:
        with gw.db.session() as s:
            return {r.id: r for r in repository.runs(s)}, {b.id: b for b in repository.benchmarks(s)}

    runs, benchmarks = await run_in_threadpool(read)
    counting: dict[str, dict[str, LeaderboardEntry]] = {}  # run -> the grader's task id -> the submission that counts
    for e in entries:
        counting.setdefault(e.run_id, {})[e.task_id] = e
    baselines: dict[str, GradingTaskStatus] = {}
    rows: list[LeaderboardRow] = []
    for run_id, by_task in counting.items():
        run = runs.get(run_id)
        if run is None:
            continue
        bm = benchmarks[run.benchmark_id]
        tasks = []
        evaluator_track = bm.spec.get("track") == "evaluator"
        for name, task_id in bm.task_ids().items():
            if evaluator_track and name != EVALUATOR_TASK:
                continue  # targets take no submission: the row is the evaluator's
            if task_id not in baselines:
                baselines[task_id] = await gw.grader.task_status(task_id)
            tasks.append(_task_score(name, baselines[task_id], by_task.get(task_id)))
        graded = [t for t in tasks if t.final_score is not None]
        all_graded = len(graded) == len(tasks)
        ends = [e.graded_at for e in by_task.values() if e.graded_at]
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
            validation_evaluations=max(e.validation_evaluations for e in by_task.values()),
            spent_usd=(await gw.ledger.get_balance(run.id)).spent_usd_micros / 1_000_000,
            elapsed_hours=(end - run.created_at).total_seconds() / 3600,
            evaluator=next((e.grade for e in by_task.values() if e.grade), None) if evaluator_track else None,
        ))
    for name in {r.benchmark for r in rows}:
        ranked = sorted((r for r in rows if r.benchmark == name and r.final_score is not None), key=lambda r: -r.final_score)  # type: ignore[operator]
        for i, r in enumerate(ranked, start=1):
            r.rank = i
    rows.sort(key=lambda r: (r.benchmark, r.rank or 10**9))
    return rows


def _task_score(task: str, baseline: GradingTaskStatus, entry: LeaderboardEntry | None) -> TaskScore:
    """One task's line: baselines from the grader's task status, the final from the submission that counts."""
    initial = baseline.initial.value if baseline.initial else None
    reference = baseline.reference.value if baseline.reference else None
    score = entry.score if entry else None
    final = score.value if score else None
    gap = (final - initial) / (reference - initial) if None not in (initial, reference, final) and reference != initial else None  # type: ignore[operator]
    return TaskScore(
        task=task, submission_id=entry.submission_id if entry else None, status=entry.status if entry else "not submitted",
        initial_score=initial, final_score=final, reference_score=reference, gap_closed=gap, n=score.n if score else None,
        final_ci=(score.ci_low, score.ci_high) if score and score.ci_low is not None else None,  # type: ignore[arg-type]
        contaminated=entry.contamination.contaminated if entry and entry.contamination else None,
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
