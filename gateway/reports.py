"""Where a run's time and money went, and what it tried: the run report (``GET /v1/run/report``, ``/admin/runs/{id}/report``).

Read from what the services already record: the trainer's jobs (created → started → finished), the grader's
evaluations (created → started → finished) and submissions (created → graded), the ledger's entries, and the
gateway's episode log (the agent's calls). Nothing here is stored; a report is computed when asked for.

**Time by activity.** A run's span is from its creation to the last thing that happened (its agent's last call before
the deadline, or its work's last end; now while work still runs). Each activity is a set of intervals: ``training`` (a job running),
``evaluating`` (a validation evaluation running), ``queued`` (a job or an evaluation waiting for a worker),
``final_grading`` (a submission from its creation to its grade). For each: ``wall_s``, the time at least one of them
ran (two jobs at once count once), and ``busy_s``, their summed durations (job-seconds: two jobs at once count twice).
The span is also cut into exclusive parts, each instant going to the first activity of
``training > evaluating > final_grading > queued`` that runs then, and to ``agent`` (the agent's own time) when none
does; the parts sum to the span. ``waiting_and_grading_s`` is the part where the run waited on a queue or on grading
(``evaluating + final_grading + queued``): what research-run studies report as 35–95 % of a run.

**Designs tried.** Datasets, recipes (as submitted: the canonical JSON of a job's recipe), harnesses (a declarative
harness's JSON or a code harness's ``har_…``) and checkpoints: for each, the validation evaluations that used it, its
best validation score and what it cost (micro-USD: the charges on the holds of its jobs or evaluations, refunds taken off).
Nothing of the hidden split is read: a submission shows only its aggregate score, as ``GET /v1/submissions`` does.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.schemas import ActivityTime, DesignTried, RunReport, SpendPoint, ValidationPoint
from gateway.service import Caller, Gateway
from services.common.contracts import EvaluationOut, SubmissionOut, TrainingJobOut
from services.common.db import utcnow
from services.ledger.schemas import Entry, EntryType

ORDER = ("training", "evaluating", "final_grading", "queued")  # who an instant belongs to when several run at once
WAITING = ("evaluating", "final_grading", "queued")
SPEND_POINTS = 200  # at most this many points in the spend series (charges merged into equal steps of time)

Interval = tuple[dt.datetime, dt.datetime]


def activity_intervals(jobs: Iterable[TrainingJobOut], evaluations: Iterable[EvaluationOut], submissions: Iterable[SubmissionOut],
                       now: dt.datetime) -> dict[str, list[Interval]]:
    """Each activity's intervals (see the module's docstring); an unfinished one ends ``now``. A job or an evaluation
    that never started is queued until it ended (cancelled while queued) or ``now``."""
    out: dict[str, list[Interval]] = {a: [] for a in ORDER}
    for job in jobs:
        _work(out, "training", job.created_at, job.started_at, job.finished_at, now)
    for ev in evaluations:
        if ev.split == "validation":
            _work(out, "evaluating", ev.created_at, ev.started_at, ev.finished_at, now)
    for sub in submissions:
        out["final_grading"].append((sub.created_at, sub.graded_at or (now if sub.status in ("queued", "running") else sub.created_at)))
    return {a: [(s, e) for s, e in spans if e > s] for a, spans in out.items()}


def _work(out: dict[str, list[Interval]], activity: str, created: dt.datetime, started: dt.datetime | None, finished: dt.datetime | None,
          now: dt.datetime) -> None:
    end = finished or now
    if started is None:
        out["queued"].append((created, end))
        return
    out["queued"].append((created, min(started, end)))
    out[activity].append((started, end))


def union_s(spans: Sequence[Interval]) -> float:
    """Seconds covered by at least one of ``spans``."""
    total, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            total += (end - start).total_seconds()
            reach = end
        elif end > reach:
            total += (end - reach).total_seconds()
            reach = end
    return total


def exclusive_s(spans: dict[str, list[Interval]], start: dt.datetime, end: dt.datetime) -> dict[str, float]:
    """The span ``start``–``end`` cut into parts: each instant goes to the first activity of :data:`ORDER` running
    then, else to ``agent``. The parts sum to the span's seconds."""
    cuts = sorted({start, end, *(t for s in spans.values() for iv in s for t in iv if start <= t <= end)})
    out = dict.fromkeys((*ORDER, "agent"), 0.0)
    for a, b in zip(cuts, cuts[1:], strict=False):
        mid = a + (b - a) / 2
        owner = next((act for act in ORDER if any(s <= mid < e for s, e in spans[act])), "agent")
        out[owner] += (b - a).total_seconds()
    return out


def spend_series(entries: Sequence[Entry], start: dt.datetime, end: dt.datetime) -> list[SpendPoint]:
    """Cumulative spend (charges less refunds, micro-USD) at the end of each of at most :data:`SPEND_POINTS` equal steps
    of the span, with the spend of each usage kind so far; steps in which nothing was charged are left out."""
    step = max((end - start) / SPEND_POINTS, dt.timedelta(seconds=1))
    kinds: dict[str, int] = defaultdict(int)
    kind_of = {e.id: e.kind for e in entries}
    points: list[SpendPoint] = []
    total = 0
    for e in sorted(entries, key=lambda e: e.created_at):
        if e.type not in (EntryType.charge, EntryType.refund):
            continue
        sign = 1 if e.type == EntryType.charge else -1
        kind = str(e.kind or kind_of.get(e.refund_of or "") or "other")
        total += sign * e.amount_usd_micros
        kinds[kind] += sign * e.amount_usd_micros
        at = start + step * (int((e.created_at - start) / step) + 1)
        point = SpendPoint(at=min(at, max(end, e.created_at)), spent_usd_micros=total, by_kind=dict(kinds))
        if points and points[-1].at == point.at:
            points[-1] = point
        else:
            points.append(point)
    return points


def costs_by_work(entries: Sequence[Entry]) -> dict[str, int]:
    """Micro-USD charged (less refunds) per job or evaluation id, read off the ledger: an evaluation's hold names it in
    its purpose (``validation evaluation eval_…``), a job's hold is the one its settlement (``settle:job_…``) charged."""
    owner: dict[str, str] = {}
    for e in entries:
        if e.type == EntryType.hold and e.hold_id and e.purpose and e.purpose.startswith("validation evaluation "):
            owner[e.hold_id] = e.purpose.rsplit(" ", 1)[-1]
        if e.type == EntryType.charge and e.hold_id and (e.idempotency_key or "").startswith("settle:job_"):
            owner[e.hold_id] = e.idempotency_key.split(":")[1]  # type: ignore[union-attr]
    charged = {e.id: e for e in entries if e.type == EntryType.charge}
    cost: dict[str, int] = defaultdict(int)
    for e in entries:
        source = e if e.type == EntryType.charge else charged.get(e.refund_of or "") if e.type == EntryType.refund else None
        if source is not None and source.hold_id in owner:
            cost[owner[source.hold_id]] += e.amount_usd_micros if e.type == EntryType.charge else -e.amount_usd_micros
    return dict(cost)


def designs_tried(jobs: Sequence[TrainingJobOut], checkpoints: dict[str, list[str]], evaluations: Sequence[EvaluationOut],
                  cost: dict[str, int]) -> list[DesignTried]:
    """Each dataset, recipe, harness and evaluated model of the run with its validation evaluations, best score and cost.

    ``checkpoints``: job id → the ids of the checkpoints it wrote. A dataset's or a recipe's evaluations are those of the
    checkpoints of the jobs that used it; its cost is those jobs' (their evaluations are counted under the harness and
    the checkpoint)."""
    job_of = {ckpt: job.id for job in jobs for ckpt in checkpoints.get(job.id, [])}
    evals = [e for e in evaluations if e.split == "validation"]
    by_job: dict[str, list[EvaluationOut]] = defaultdict(list)
    for e in evals:
        if e.model in job_of:
            by_job[job_of[e.model]].append(e)
    groups: dict[tuple[str, str], tuple[list[EvaluationOut], int, int]] = {}

    def add(kind: str, key: str, used: list[EvaluationOut], spent: int, uses: int = 1) -> None:
        old = groups.get((kind, key), ([], 0, 0))
        groups[(kind, key)] = (old[0] + [e for e in used if e not in old[0]], old[1] + spent, old[2] + uses)

    for job in jobs:
        add("recipe", json.dumps(job.recipe.model_dump(mode="json", exclude_defaults=True), sort_keys=True), by_job[job.id], cost.get(job.id, 0))
        for ds in job.datasets:
            add("dataset", ds, by_job[job.id], cost.get(job.id, 0))
    for e in evals:
        harness = e.harness_archive or json.dumps(e.harness.model_dump(mode="json", exclude_defaults=True) if e.harness else {}, sort_keys=True)
        add("harness", harness, [e], cost.get(e.id, 0))
        add("checkpoint" if e.model.startswith("ckpt_") else "model", e.model, [e], cost.get(e.id, 0))
    out = []
    for (kind, key), (used, spent, uses) in groups.items():
        scores = [e.score.value for e in used if e.score is not None and e.status == "succeeded"]
        out.append(DesignTried(kind=kind, key=key, uses=uses, evaluations=len(used), best_validation_score=max(scores, default=None),
                               cost_usd_micros=spent))
    return sorted(out, key=lambda d: (d.kind, -(d.best_validation_score or -1), d.key))


def validation_points(evaluations: Sequence[EvaluationOut]) -> list[ValidationPoint]:
    """Each finished validation evaluation with a score, in the order they finished."""
    done = [e for e in evaluations if e.split == "validation" and e.score is not None and e.finished_at is not None]
    return [ValidationPoint(eval_id=e.id, at=e.finished_at, model=e.model, checkpoint=e.model.startswith("ckpt_"), task=e.task,  # type: ignore[arg-type]
                            score=e.score.value, ci_low=e.score.ci_low, ci_high=e.score.ci_high, items=e.score.n)  # type: ignore[union-attr]
            for e in sorted(done, key=lambda e: e.finished_at)]  # type: ignore[arg-type, return-value]


def build_report(*, run_id: str, created_at: dt.datetime, deadline_at: dt.datetime, budget_usd_micros: int, calls: int,
                 last_call: dt.datetime | None, jobs: Sequence[TrainingJobOut], checkpoints: dict[str, list[str]],
                 evaluations: Sequence[EvaluationOut], submissions: Sequence[SubmissionOut], entries: Sequence[Entry],
                 now: dt.datetime) -> RunReport:
    """The report of one run from what its services answered (see the module's docstring for every figure). The agent's
    calls after ``deadline_at`` (reads, this report's own among them) do not lengthen the run."""
    last_call = min(last_call, deadline_at) if last_call is not None else None
    spans = activity_intervals(jobs, evaluations, submissions, now)
    ends = [e for s in spans.values() for _, e in s] + ([last_call] if last_call else [])
    end = max([created_at, *ends])
    cut = exclusive_s(spans, created_at, end)
    wall = (end - created_at).total_seconds()
    time = [ActivityTime(activity=a, wall_s=round(union_s(spans[a]), 3), busy_s=round(sum((e - s).total_seconds() for s, e in spans[a]), 3),
                         exclusive_s=round(cut[a], 3), count=len(spans[a])) for a in ORDER]
    time.append(ActivityTime(activity="agent", wall_s=round(cut["agent"], 3), busy_s=round(cut["agent"], 3), exclusive_s=round(cut["agent"], 3),
                             count=calls))
    waiting = sum(cut[a] for a in WAITING)
    spend = spend_series(entries, created_at, end)
    by_design = designs_tried(jobs, checkpoints, evaluations, costs_by_work(entries))
    tried = {kind: sum(1 for d in by_design if d.kind == kind) for kind in ("dataset", "recipe", "harness", "checkpoint")}
    return RunReport(run_id=run_id, started_at=created_at, ended_at=end, wall_s=round(wall, 3), time=time,
                     waiting_and_grading_s=round(waiting, 3), waiting_and_grading_share=round(waiting / wall, 4) if wall else 0.0,
                     agent_calls=calls, budget_usd_micros=budget_usd_micros, spent_usd_micros=spend[-1].spent_usd_micros if spend else 0,
                     spend=spend, tried=tried, designs=by_design, validation=validation_points(evaluations),
                     submissions=[s.model_dump(mode="json", include={"id", "task", "model", "status", "score", "created_at", "graded_at"})
                                  for s in submissions])


async def gather_checkpoints(list_checkpoints: Any, jobs: Sequence[TrainingJobOut]) -> dict[str, list[str]]:
    """Job id → its checkpoints' ids, asked of the trainer for every job at once (``list_checkpoints(job_id)``)."""
    pages = await asyncio.gather(*(list_checkpoints(job.id) for job in jobs))
    return {job.id: [c.id for c in page.data] for job, page in zip(jobs, pages, strict=True)}


async def run_report(gw: Gateway, caller: Caller) -> RunReport:
    """The report of ``caller``'s run, asked of the trainer, grader and ledger at once (their 503s pass through)."""
    run = caller.run
    jobs, evaluations, submissions, entries = await asyncio.gather(
        gw.trainer.list_jobs(caller.ctx), gw.grader.list_evaluations(caller.ctx), gw.grader.list_submissions(caller.ctx),
        _entries(gw, run.id))
    checkpoints = await gather_checkpoints(lambda job_id: gw.trainer.job_checkpoints(caller.ctx, job_id), jobs.data)

    def episode() -> tuple[int, dt.datetime | None]:
        with gw.db.session() as s:
            return repository.episode_summary(s, run.id)

    calls, last_call = await run_in_threadpool(episode)
    return build_report(run_id=run.id, created_at=run.created_at, deadline_at=run.deadline_at, budget_usd_micros=run.budget_usd_micros,
                        calls=calls, last_call=last_call,
                        jobs=jobs.data, checkpoints=checkpoints, evaluations=evaluations.data, submissions=submissions.data, entries=entries,
                        now=utcnow())


async def _entries(gw: Gateway, run_id: str) -> list[Entry]:
    """Every ledger entry of the run, page by page."""
    out: list[Entry] = []
    while True:
        page = await gw.ledger.list_entries(run_id, after=out[-1].id if out else None, limit=10_000)
        out += page
        if len(page) < 10_000:
            return out
