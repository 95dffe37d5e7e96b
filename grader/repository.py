"""Queries of the grader's database that several parts of the grader make: a task's spec and validation items, a new
evaluation's row, and the run's own evaluations and submissions. Each takes the caller's session."""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, and_, func, select
from sqlalchemy.orm import Session

from grader.models import Evaluation, GradingTask, Submission, ValidationItem
from grader.suites import Item
from services.common.auth import RunContext
from services.common.contracts import GradingSpec, Harness
from services.common.db import utcnow
from services.common.errors import NotFound
from services.common.ids import new_id


def grading_task(s: Session, task_id: str) -> GradingTask:
    """The task's row; raises ``NotFound`` unless it is registered."""
    task = s.get(GradingTask, task_id)
    if task is None:
        raise NotFound(f"task {task_id} is not registered with the grader")
    return task


def spec(s: Session, task_id: str) -> GradingSpec:
    """The task's grading spec (no test seed); raises ``NotFound`` unless it is registered."""
    return GradingSpec.model_validate(grading_task(s, task_id).spec)


def _validation(task_id: str) -> Select[tuple[ValidationItem]]:
    return select(ValidationItem).where(ValidationItem.task_id == task_id)


def validation_items(s: Session, task_id: str) -> list[Item]:
    """The task's visible validation items, in split order."""
    return [Item(id=r.item_id, question=r.question, answer=r.answer, entry=r.entry)
            for r in s.scalars(_validation(task_id).order_by(ValidationItem.position))]


def count_validation_items(s: Session, task_id: str) -> int:
    """How many visible validation items the task has."""
    return s.scalar(select(func.count()).select_from(_validation(task_id).subquery())) or 0


def add_evaluation(s: Session, spec: GradingSpec, *, run_id: str | None, purpose: str, split: str, model: str, harness: Harness,
                   items_total: int, hold_id: str | None = None, eval_id: str | None = None, harness_archive: str | None = None) -> str:
    """Add a queued evaluation of ``model`` with ``harness`` (or the code harness ``harness_archive``) on ``items_total``
    items of the task's ``split``; returns its id (``eval_id``, or a new one). ``purpose``: validation (a run's),
    submission, initial or reference (baselines)."""
    eval_id = eval_id or new_id("eval")
    s.add(Evaluation(id=eval_id, run_id=run_id, task_id=spec.task_id, purpose=purpose, split=split, model=model, harness=harness.model_dump(),
                     harness_archive=harness_archive, status="queued", items_total=items_total, hold_id=hold_id, created_at=utcnow(),
                     enqueued_at=utcnow()))
    return eval_id


def owned_evaluation(s: Session, ctx: RunContext, eval_id: str) -> Evaluation:
    """One of the run's validation evaluations; raises ``NotFound`` for any other id (a submission's grading included)."""
    ev = s.get(Evaluation, eval_id)
    if ev is None or ev.run_id != ctx.run_id or ev.purpose != "validation":
        raise NotFound(f"evaluation {eval_id} not found")
    return ev


def owned_submission(s: Session, ctx: RunContext, sub_id: str) -> Submission:
    """One of the run's submissions; raises ``NotFound`` for any other id."""
    sub = s.get(Submission, sub_id)
    if sub is None or sub.run_id != ctx.run_id:
        raise NotFound(f"submission {sub_id} not found")
    return sub


def of_run_validation(run_id: str) -> ColumnElement[bool]:
    """The filter of the run's validation evaluations (its submissions' gradings and the baselines left out)."""
    return and_(Evaluation.run_id == run_id, Evaluation.purpose == "validation")
