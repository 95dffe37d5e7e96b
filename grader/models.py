"""ORM tables of the grader (its main database; the hidden test split is in ``teststore``)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import UTCDateTime, utcnow
from services.common.jobs import JobColumns


class Base(DeclarativeBase):
    pass


AGENT, PLATFORM = "agent", "platform"  # whose fault a failed evaluation is (Evaluation.failure_cause)
PLATFORM_RUN = ""
"""The ``run_id`` of the suites' own harness archives (:class:`HarnessArchive`): every run may read and use them."""


class GradingTask(JobColumns, Base):
    """One task of a benchmark as the grader knows it (a benchmark of several tasks is several of these): its
    grading spec (no test seed), its baseline evaluations, and the build of its splits as a job
    (:func:`grader.grading_tasks.build_splits`, leased as ``services.common.jobs`` states): ``status`` ``queued`` →
    ``running`` → ``succeeded`` (the splits are stored, the baselines queued) or ``failed`` (``error``: why)."""

    __tablename__ = "grading_tasks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    initial_evaluation_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    reference_evaluation_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)  # of the splits' build
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why the build failed (for the operator)
    warnings: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # what the operator should know of the splits, once built
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class ValidationItem(Base):
    __tablename__ = "validation_items"
    __table_args__ = (UniqueConstraint("task_id", "item_id"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("grading_tasks.id"), index=True)
    item_id: Mapped[str] = mapped_column(String(40))
    position: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    answer: Mapped[str] = mapped_column(Text)
    entry: Mapped[dict[str, Any]] = mapped_column(JSON)


class Evaluation(JobColumns, Base):
    """A system × split evaluation. ``purpose``: validation (a run's), submission, ablation (a submission's null-model
    ablation), initial or reference (baselines), or candidate (an evaluator-track target's grading of one candidate)."""

    __tablename__ = "evaluations"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str | None] = mapped_column(String(40), index=True, nullable=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("grading_tasks.id"), index=True)
    purpose: Mapped[str] = mapped_column(String(20))
    split: Mapped[str] = mapped_column(String(20))
    model: Mapped[str] = mapped_column(String(100))
    harness: Mapped[dict[str, Any]] = mapped_column(JSON)
    harness_archive: Mapped[str | None] = mapped_column(String(40), nullable=True)  # a code harness (HarnessArchive.id); then `harness` is unused
    candidate: Mapped[str | None] = mapped_column(String(20), nullable=True)  # purpose "candidate": the candidate's opaque name on a target
    ablation: Mapped[str | None] = mapped_column(String(20), nullable=True)  # "null_model": the model replaced by the null model (grader.model_endpoint)
    status: Mapped[str] = mapped_column(String(20), index=True)
    items_total: Mapped[int] = mapped_column(Integer)
    item_ids: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # the items it covers, where not the split's first items_total
    items_done: Mapped[int] = mapped_column(Integer, default=0)
    score: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    grade: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # an evaluator's evaluation: its EvaluatorGrade
    hold_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # whose fault a failure is: AGENT (the evaluated system) or PLATFORM (grader, services, workers); None unless failed
    failure_cause: Mapped[str | None] = mapped_column(String(20), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class Trajectory(Base):
    """One sample of one validation item: prompt, completion, extracted answer, score (and why it is 0 when the
    suite's scorer raised on the answer: ``grader.scoring.score_item``)."""

    __tablename__ = "trajectories"
    __table_args__ = (UniqueConstraint("evaluation_id", "item_id", "sample"),)

    pk: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[str] = mapped_column(ForeignKey("evaluations.id"), index=True)
    item_id: Mapped[str] = mapped_column(String(40))
    sample: Mapped[int] = mapped_column(Integer)
    question: Mapped[str] = mapped_column(Text)
    messages: Mapped[list[dict[str, str]]] = mapped_column(JSON)
    completion: Mapped[str] = mapped_column(Text)
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    expected: Mapped[str] = mapped_column(Text)
    score: Mapped[float] = mapped_column(Float)
    score_error: Mapped[str | None] = mapped_column(Text, nullable=True)  # why the scorer could not score the answer (score 0)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    rollout: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # a code harness's rollout (grader.rollouts.RolloutTrajectory)


class Submission(Base):
    """A run's final submission, graded by a test-split evaluation, and by a second one with the null model in place of
    its model (``ablation_evaluation_id``; none for a submission made before the ablation existed)."""

    __tablename__ = "submissions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    task_id: Mapped[str] = mapped_column(ForeignKey("grading_tasks.id"), index=True)
    model: Mapped[str] = mapped_column(String(100))
    harness: Mapped[dict[str, Any]] = mapped_column(JSON)
    harness_archive: Mapped[str | None] = mapped_column(String(40), nullable=True)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)
    evaluation_id: Mapped[str] = mapped_column(String(40))
    ablation_evaluation_id: Mapped[str | None] = mapped_column(String(40), nullable=True)  # its null-model ablation (model_free_score)
    contamination: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # grader.schemas.ContaminationReport
    datasets: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, nullable=True)  # the run's grader.schemas.DatasetDigest at submission
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class HarnessArchive(Base):
    """A code harness archive (:mod:`grader.harness_archives`): a run's upload, or a suite's own (``run_id`` ``""``);
    immutable, content-addressed (``sha256``) within its run."""

    __tablename__ = "harness_archives"
    __table_args__ = (UniqueConstraint("run_id", "sha256"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    name: Mapped[str] = mapped_column(String(200))
    sha256: Mapped[str] = mapped_column(String(64))
    bytes: Mapped[int] = mapped_column(Integer)
    uri: Mapped[str] = mapped_column(Text)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON)  # grader.harness_archives.HarnessManifest
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
