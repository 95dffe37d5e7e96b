"""Every query of the grader's main database, by aggregate: grading tasks (spec, validation items), evaluations (and
their trajectories), submissions, harness archives. Each function takes the caller's session (the caller holds the
transaction) and is named for what it asks; ``add_*`` functions flush, so the row is written (its constraints checked,
its defaults set) when they return. The rules (limits, whose fault, what counts) are in the modules that call these;
the hidden test store has its own database and module (:mod:`grader.teststore`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, or_, select, update
from sqlalchemy.orm import Session

from grader.models import PLATFORM, PLATFORM_RUN, Evaluation, GradingTask, HarnessArchive, Submission, Trajectory, ValidationItem
from grader.schemas import SubmissionGrading
from grader.suites import Item
from services.common.auth import RunContext
from services.common.contracts import GradingSpec, Harness
from services.common.db import utcnow
from services.common.errors import NotFound
from services.common.ids import new_id

# --------------------------------------------------------------------------- grading tasks


def grading_task(s: Session, task_id: str) -> GradingTask:
    """The task's row; raises ``NotFound`` unless it is registered."""
    task = s.get(GradingTask, task_id)
    if task is None:
        raise NotFound(f"task {task_id} is not registered with the grader")
    return task


def spec(s: Session, task_id: str) -> GradingSpec:
    """The task's grading spec (no test seed); raises ``NotFound`` unless it is registered."""
    return GradingSpec.model_validate(grading_task(s, task_id).spec)


def add_task(s: Session, spec: GradingSpec) -> GradingTask:
    """Add the task's row, the build of its splits queued (no validation items, no baselines yet); returns it. A second
    row of the same id violates the primary key (``IntegrityError``, at the flush)."""
    task = GradingTask(id=spec.task_id, spec=spec.model_dump(mode="json"), status="queued", attempts=0, created_at=utcnow(), enqueued_at=utcnow())
    s.add(task)
    s.flush()
    return task


def requeue_failed_task(s: Session, task_id: str) -> bool:
    """Queue again the build of the task's splits if it failed (its error cleared, its attempts and resends reset);
    whether it did. A conditional update: of two calls at once, one requeues."""
    return bool(s.execute(update(GradingTask).where(GradingTask.id == task_id, GradingTask.status == "failed").values(
        status="queued", error=None, attempts=0, resends=0, worker_id=None, finished_at=None, enqueued_at=utcnow())).rowcount)


def add_validation_items(s: Session, task_id: str, validation: list[Item]) -> None:
    """Add the task's ``validation`` items, in split order."""
    s.add_all(ValidationItem(task_id=task_id, item_id=it.id, position=i, question=it.question, answer=it.answer, entry=it.entry)
              for i, it in enumerate(validation))
    s.flush()


def _validation(task_id: str) -> Select[tuple[ValidationItem]]:
    return select(ValidationItem).where(ValidationItem.task_id == task_id)


def validation_items(s: Session, task_id: str) -> list[Item]:
    """The task's visible validation items, in split order."""
    return [Item(id=r.item_id, question=r.question, answer=r.answer, entry=r.entry)
            for r in s.scalars(_validation(task_id).order_by(ValidationItem.position))]


def count_validation_items(s: Session, task_id: str) -> int:
    """How many visible validation items the task has."""
    return s.scalar(select(func.count()).select_from(_validation(task_id).subquery())) or 0


# --------------------------------------------------------------------------- evaluations


def add_evaluation(s: Session, spec: GradingSpec, *, run_id: str | None, purpose: str, split: str, model: str, harness: Harness,
                   items_total: int, hold_id: str | None = None, eval_id: str | None = None, harness_archive: str | None = None,
                   candidate: str | None = None, item_ids: list[str] | None = None, ablation: str | None = None) -> Evaluation:
    """Add a queued evaluation of ``model`` with ``harness`` (or the code harness ``harness_archive``) on ``items_total``
    items of the task's ``split`` (its first ones, or those of ``item_ids``); returns its row (id ``eval_id``, or a new
    one). ``purpose``: validation (a run's), submission, ablation (a submission's null-model ablation), initial or
    reference (baselines), candidate (``candidate``'s grading on a target). ``ablation``: ``null_model`` to answer every
    model call with the null model."""
    ev = Evaluation(id=eval_id or new_id("eval"), run_id=run_id, task_id=spec.task_id, purpose=purpose, split=split, model=model,
                    harness=harness.model_dump(), harness_archive=harness_archive, status="queued", items_total=items_total, hold_id=hold_id,
                    candidate=candidate, item_ids=item_ids, ablation=ablation, created_at=utcnow(), enqueued_at=utcnow())
    s.add(ev)
    s.flush()
    return ev


def evaluation(s: Session, eval_id: str) -> Evaluation:
    """The evaluation's row, whoever's it is; raises ``NotFound`` if there is none."""
    ev = s.get(Evaluation, eval_id)
    if ev is None:
        raise NotFound(f"evaluation {eval_id} not found")
    return ev


def owned_evaluation(s: Session, ctx: RunContext, eval_id: str) -> Evaluation:
    """One of the run's validation evaluations; raises ``NotFound`` for any other id (a submission's grading included)."""
    ev = s.get(Evaluation, eval_id)
    if ev is None or ev.run_id != ctx.run_id or ev.purpose != "validation":
        raise NotFound(f"evaluation {eval_id} not found")
    return ev


def _of_run_validation(run_id: str) -> ColumnElement[bool]:
    """The filter of the run's validation evaluations (its submissions' gradings and the baselines left out)."""
    return and_(Evaluation.run_id == run_id, Evaluation.purpose == "validation")


def validation_evaluations(s: Session, run_id: str) -> list[Evaluation]:
    """The run's validation evaluations, oldest first (by id)."""
    return list(s.scalars(select(Evaluation).where(_of_run_validation(run_id)).order_by(Evaluation.id)))


def count_validation_evaluations(s: Session, run_id: str) -> int:
    """How many validation evaluations the run has made, whatever their state."""
    return s.scalar(select(func.count()).select_from(Evaluation).where(_of_run_validation(run_id))) or 0


def trajectories(s: Session, eval_id: str) -> list[Trajectory]:
    """The evaluation's scored samples (validation only: a test split's are in the test store), by item id then sample."""
    return list(s.scalars(select(Trajectory).where(Trajectory.evaluation_id == eval_id).order_by(Trajectory.item_id, Trajectory.sample)))


def mean_score_so_far(s: Session, eval_id: str) -> float | None:
    """The mean score of the evaluation's samples graded so far (``None`` before the first)."""
    return s.scalar(select(func.avg(Trajectory.score)).where(Trajectory.evaluation_id == eval_id))


def add_trajectory(s: Session, eval_id: str, item: Item, sample: int, *, score: float, score_error: str | None, answer: str | None,
                   row: dict[str, Any]) -> Trajectory:
    """Add one scored sample of ``item`` to the evaluation; ``row``: its ``messages``, ``completion``, ``prompt_tokens``,
    ``completion_tokens`` and (a rollout's) ``rollout``. Returns its row."""
    trajectory = Trajectory(evaluation_id=eval_id, item_id=item.id, sample=sample, question=item.question, answer=answer, expected=item.answer,
                            score=score, score_error=score_error, **row)
    s.add(trajectory)
    s.flush()
    return trajectory


# --------------------------------------------------------------------------- submissions


def add_submission(s: Session, ctx: RunContext, req: SubmissionGrading, *, harness: Harness, harness_archive: str | None,
                   evaluation_id: str, ablation_evaluation_id: str | None = None) -> Submission:
    """Add the run's submission of ``req`` (its model, note and dataset digests) with ``harness`` (or the code harness
    ``harness_archive``), graded by ``evaluation_id`` and ablated by ``ablation_evaluation_id``; returns its row."""
    sub = Submission(id=new_id("sub"), run_id=ctx.run_id, task_id=ctx.task_id, model=req.model, harness=harness.model_dump(),
                     harness_archive=harness_archive, note=req.note, evaluation_id=evaluation_id,
                     ablation_evaluation_id=ablation_evaluation_id, datasets=[d.model_dump() for d in req.datasets],
                     created_at=utcnow())
    s.add(sub)
    s.flush()
    return sub


def owned_submission(s: Session, ctx: RunContext, sub_id: str) -> Submission:
    """One of the run's submissions; raises ``NotFound`` for any other id."""
    sub = s.get(Submission, sub_id)
    if sub is None or sub.run_id != ctx.run_id:
        raise NotFound(f"submission {sub_id} not found")
    return sub


def submission_graded_by(s: Session, eval_id: str) -> Submission | None:
    """The submission that evaluation ``eval_id`` grades; ``None`` for any other evaluation (validation, baselines)."""
    return s.scalar(select(Submission).where(Submission.evaluation_id == eval_id))


def run_submissions(s: Session, run_id: str) -> list[Submission]:
    """The run's submissions (every task's), oldest first (by id)."""
    return list(s.scalars(select(Submission).where(Submission.run_id == run_id).order_by(Submission.id)))


def count_submissions(s: Session, run_id: str, task_id: str) -> int:
    """How many submissions the run has made for the task, whatever their gradings' states."""
    return s.scalar(select(func.count()).select_from(Submission).where(Submission.run_id == run_id, Submission.task_id == task_id)) or 0


def count_platform_failed_submissions(s: Session, run_id: str, task_id: str, up_to: str | None = None) -> int:
    """How many of the run's submissions for the task (those of id ≤ ``up_to``, if given) have a grading or a null-model
    ablation that failed by the platform's fault (``failure_cause`` :data:`~grader.models.PLATFORM`)."""
    graded_by = or_(Evaluation.id == Submission.evaluation_id, Evaluation.id == Submission.ablation_evaluation_id)
    query = (select(func.count(func.distinct(Submission.id))).select_from(Submission).join(Evaluation, graded_by)
             .where(Submission.run_id == run_id, Submission.task_id == task_id, Evaluation.status == "failed",
                    Evaluation.failure_cause == PLATFORM))
    return s.scalar(query.where(Submission.id <= up_to) if up_to else query) or 0


def submissions_with_gradings(s: Session) -> list[tuple[Submission, Evaluation]]:
    """Every submission of every run with the evaluation grading it, oldest first (by creation time, then id)."""
    rows = s.execute(select(Submission, Evaluation).join(Evaluation, Evaluation.id == Submission.evaluation_id)
                     .order_by(Submission.created_at, Submission.id))
    return [(sub, ev) for sub, ev in rows]


# --------------------------------------------------------------------------- harness archives


def add_archive(s: Session, run_id: str, *, name: str, sha256: str, size: int, uri: str, manifest: dict[str, Any]) -> HarnessArchive:
    """Add the record of an archive stored at ``uri`` (``size`` bytes, digest ``sha256``) for ``run_id``
    (:data:`~grader.models.PLATFORM_RUN` for a suite's own); returns its row. A second record of the same bytes for the
    same run violates the table's unique constraint."""
    row = HarnessArchive(id=new_id("har"), run_id=run_id, name=name, sha256=sha256, bytes=size, uri=uri, manifest=manifest, created_at=utcnow())
    s.add(row)
    s.flush()
    return row


def run_archive_by_digest(s: Session, run_id: str, sha256: str) -> HarnessArchive | None:
    """The run's record of the archive whose bytes have digest ``sha256``; ``None`` if it has none."""
    return s.scalar(select(HarnessArchive).where(HarnessArchive.run_id == run_id, HarnessArchive.sha256 == sha256))


def usable_archive(s: Session, ctx: RunContext | None, harness_id: str) -> HarnessArchive:
    """The archive ``harness_id`` if ``ctx``'s run may use it (its own, or a suite's; a baseline, ``ctx=None``, only a
    suite's); raises ``NotFound`` (field ``harness_archive``) otherwise."""
    row = s.get(HarnessArchive, harness_id)
    if row is None or row.run_id not in (PLATFORM_RUN, ctx.run_id if ctx else PLATFORM_RUN):
        raise NotFound(f"harness archive {harness_id} not found", field="harness_archive")
    return row


def usable_archives(s: Session, run_id: str) -> list[HarnessArchive]:
    """The archives the run may use (its own and the suites'), oldest first (by creation time)."""
    return list(s.scalars(select(HarnessArchive).where(HarnessArchive.run_id.in_((run_id, PLATFORM_RUN))).order_by(HarnessArchive.created_at)))


def candidate_evaluations(s: Session, task_id: str) -> list[Evaluation]:
    """A target's gradings of its candidates (purpose ``candidate``), by candidate name."""
    return list(s.scalars(select(Evaluation).where(Evaluation.task_id == task_id, Evaluation.purpose == "candidate").order_by(Evaluation.candidate)))
