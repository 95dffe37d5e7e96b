"""The public leaderboard: per run, its final submissions on each task of its benchmark, scored and ranked.

The grader says which submission of each run and task counts and its aggregate test score
(``GraderClient.leaderboard``) and each task's baselines (``task_status``); the ledger says what the run spent.

**Sealed figures wait for the benchmark to close.** On the evaluator track a grade's figures beyond its headline (the
mean pairwise agreement, the grade itself, with its interval) derive from the sealed targets' scores: Kendall's τ and
Lin's concordance (the targets' ties and scale), the ceiling (the targets' agreement among themselves: no evaluator's
doing at all), and each sealed target's own row (its name and agreement). A run still open could read them to learn the
sealed ranking, so the public board withholds them (:func:`without_sealed_figures`, ``sealed_withheld``) until its
benchmark is closed: no run of it open, each past its deadline or revoked. The operator's board
(``GET /admin/leaderboard``) shows them always, and each task's audit findings on the run's harness archives. What the evaluator itself did (its calls, tokens, failure modes) is shown
throughout.
"""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.models import Benchmark, Run
from gateway.schemas import EVALUATOR_TASK, LeaderboardRow, TaskScore
from gateway.service import Gateway
from grader.schemas import LeaderboardEntry
from services.common.contracts import EvaluatorGrade, GradingTaskStatus
from services.common.db import utcnow


async def leaderboard(gw: Gateway, *, operator: bool = False) -> list[LeaderboardRow]:
    """One row per run with a final submission, ranked by final test score (Avg over tasks) within each benchmark.

    Per task, the run's latest graded submission counts (a later one queued, running or failed leaves the row as it
    was; until one is graded, the latest one shows its status; the grader picks it).
    Gap closed = (final − initial) / (reference − initial), with initial and reference scored by the grader on
    the same hidden split (or the reference score the benchmark declares), and final the model-dependent final score
    (:func:`model_dependent_final`: the final score less what the submitted harness scores above the initial system
    with a null model). Over tasks: Avg = mean of the finals, gap closed = mean of the tasks' gaps, RSI-Index = mean of
    (final − initial) / (1 − initial) (RSIGym's definition, with the same model-dependent final). On the evaluator track a row is its frozen evaluator's
    (the track's own task): final = mean pairwise agreement with the sealed targets, and its grade in ``evaluator``,
    its sealed figures withheld while the benchmark is open unless ``operator`` (see the module docstring).
    """
    entries = (await gw.grader.leaderboard()).data

    def read() -> tuple[dict[str, Run], dict[str, Benchmark]]:
        with gw.db.session() as s:
            return {r.id: r for r in repository.runs(s)}, {b.id: b for b in repository.benchmarks(s)}

    runs, benchmarks = await run_in_threadpool(read)
    now = utcnow()
    open_benchmarks = {r.benchmark_id for r in runs.values() if r.revoked_at is None and r.deadline_at > now}
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
            if operator and (counted := by_task.get(task_id)) and counted.contamination:
                tasks[-1].harness_findings = counted.contamination.harness_findings
        graded = [t for t in tasks if t.final_score is not None]
        all_graded = len(graded) == len(tasks)
        ends = [e.graded_at for e in by_task.values() if e.graded_at]
        end = max(ends) if all_graded and ends else utcnow()
        contamination = [t.contaminated for t in tasks if t.contaminated is not None]
        one = tasks[0] if len(tasks) == 1 else None
        grade = next((e.grade for e in by_task.values() if e.grade), None) if evaluator_track else None
        rows.append(LeaderboardRow(
            rank=None, run_id=run.id, benchmark=bm.name, agent_name=run.agent_name, tasks=tasks,
            status="graded" if all_graded else _least_advanced([t.status for t in tasks]),
            submission_id=one.submission_id if one else None,
            initial_score=_mean([t.initial_score for t in tasks]), final_score=_mean([t.final_score for t in tasks]) if all_graded else None,
            reference_score=_mean([t.reference_score for t in tasks]), gap_closed=_mean([t.gap_closed for t in tasks]) if all_graded else None,
            rsi_index=_mean([_rsi_term(t) for t in tasks]) if all_graded else None,
            n=sum(t.n or 0 for t in tasks) if graded else None, final_ci=one.final_ci if one else None,
            contaminated=any(contamination) if contamination else None,
            model_free_score=_mean([t.model_free_score for t in tasks]) if all(t.model_free_score is not None for t in tasks) else None,
            model_free_above_initial=_any([t.model_free_above_initial for t in tasks]),
            validation_evaluations=max(e.validation_evaluations for e in by_task.values()),
            spent_usd=(await gw.ledger.get_balance(run.id)).spent_usd_micros / 1_000_000,
            elapsed_hours=(end - run.created_at).total_seconds() / 3600,
            evaluator=grade if operator or grade is None or bm.id not in open_benchmarks else without_sealed_figures(grade),
            sealed_withheld=None if grade is None else not operator and bm.id in open_benchmarks,
        ))
    for name in {r.benchmark for r in rows}:
        ranked = sorted((r for r in rows if r.benchmark == name and r.final_score is not None), key=lambda r: -r.final_score)  # type: ignore[operator]
        for i, r in enumerate(ranked, start=1):
            r.rank = i
    rows.sort(key=lambda r: (r.benchmark, r.rank or 10**9))
    return rows


def model_dependent_final(final: float, initial: float, model_free: float | None) -> float:
    """The part of a final score that the leaderboard credits to the system's model: ``final − max(0, model_free − initial)``.

    ``model_free`` is the null-model ablation's score on the same hidden split: the submitted harness with a model that
    answers every request with an empty message (``None``: the submission has no ablation, as before it existed). What
    a harness scores by itself is no credit: the leaderboard measures how far a system improves with its model, and a
    harness that solves tasks without one (an answer key, a solver for a template) measures nothing of that. Only the
    model-free score *above the initial system's* is taken off, floored at 0:

    - ``model_free ≤ initial`` (a harness that answers nothing by itself, or less than the initial system does with its
      model): nothing is taken off, and gap closed and RSI-Index are as without the ablation. A few items an empty
      answer happens to pass are already in the initial system's score, which the gap is measured from.
    - ``model_free > initial``: the gain over the initial system is ``final − model_free``: only what the model adds to
      what the harness scores alone. A harness that scores as much without the model as with it closes no gap, however
      high its score; one that does worse with its model than without closes a negative gap.

    The formula is continuous in ``model_free`` and never adds to a score."""
    return final - max(0.0, model_free - initial) if model_free is not None else final


def without_sealed_figures(grade: EvaluatorGrade) -> EvaluatorGrade:
    """``grade`` as the public board shows it while its benchmark is open: the headline agreement and what the evaluator
    did, without Kendall's τ, concordance, ceiling and the per-target rows (see the module docstring)."""
    return grade.model_copy(update={"kendall_tau": None, "concordance": None, "ceiling": None, "targets": []})


def _task_score(task: str, baseline: GradingTaskStatus, entry: LeaderboardEntry | None) -> TaskScore:
    """One task's line: baselines from the grader's task status, the final and the null-model ablation's score from the
    submission that counts (the grader shows both once both are graded); ``model_free_above_initial`` flags an ablation
    that scores above the initial system."""
    initial = baseline.initial.value if baseline.initial else None
    reference = baseline.reference.value if baseline.reference else None
    score = entry.score if entry else None
    final = score.value if score else None
    model_free = entry.model_free_score.value if entry and entry.model_free_score else None
    credited = model_dependent_final(final, initial, model_free) if None not in (initial, final) else None  # type: ignore[arg-type]
    gap = (credited - initial) / (reference - initial) if None not in (initial, reference, credited) and reference != initial else None  # type: ignore[operator]
    return TaskScore(
        task=task, submission_id=entry.submission_id if entry else None, status=entry.status if entry else "not submitted",
        initial_score=initial, final_score=final, reference_score=reference, gap_closed=gap, n=score.n if score else None,
        model_free_score=model_free,
        model_free_above_initial=model_free > initial if None not in (model_free, initial) else None,  # type: ignore[operator]
        final_ci=(score.ci_low, score.ci_high) if score and score.ci_low is not None else None,  # type: ignore[arg-type]
        contaminated=entry.contamination.contaminated if entry and entry.contamination else None,
    )


def _rsi_term(t: TaskScore) -> float | None:
    """(final − initial) / (1 − initial), final the model-dependent one (:func:`model_dependent_final`); ``None`` when a
    score is missing or the initial system is already perfect."""
    if t.final_score is None or t.initial_score is None or t.initial_score >= 1.0:
        return None
    return (model_dependent_final(t.final_score, t.initial_score, t.model_free_score) - t.initial_score) / (1.0 - t.initial_score)


def _mean(values: list[float | None]) -> float | None:
    """Mean of ``values``; ``None`` if any is missing."""
    return None if not values or any(v is None for v in values) else sum(values) / len(values)  # type: ignore[arg-type,misc]


def _any(flags: list[bool | None]) -> bool | None:
    """Whether any known flag is set; ``None`` when none is known."""
    known = [f for f in flags if f is not None]
    return any(known) if known else None


def _least_advanced(statuses: list[str]) -> str:
    order = ["not submitted", "failed", "queued", "running", "graded"]
    return min(statuses, key=lambda x: order.index(x) if x in order else 0)
