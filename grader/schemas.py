"""Wire models of the grader's internal API that no other service re-exposes as they are (the shared ones are in
:mod:`services.common.contracts`)."""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import BaseModel, Field

from services.common.contracts import EvaluatorGrade, GradingTaskStatus, Score, SubmissionCreate
from services.common.openai_protocol import ModelOut


class TaskRegistered(GradingTaskStatus):
    """A grading task as registered: its status (``splits`` ``building`` until its build has run)."""


class DatasetDigest(BaseModel):
    """One of the run's uploaded datasets as the gateway hands it over with a submission: its id and the SHA-256 of its
    bytes, by which the grader reads it from the artifact store (``services.common.artifacts.dataset_key``)."""

    id: str = Field(max_length=40)
    sha256: str = Field(pattern="^[0-9a-f]{64}$")


class SubmissionGrading(SubmissionCreate):
    """A submission as the gateway forwards it: the agent's request and the run's datasets at that moment, which the
    contamination audit reads from the artifact store (the grader never calls the trainer)."""

    datasets: list[DatasetDigest] = Field(default_factory=list, max_length=10_000)


class ContaminationReport(BaseModel):
    """What the contamination audit (:mod:`grader.audit`) found: ``flagged_items`` of ``items`` test items overlap the run's
    datasets; ``harness_findings``: the solution material its harness archives carry. ``contaminated`` if either."""

    contaminated: bool
    flagged_items: int
    items: int
    datasets: int = Field(description="Datasets of the run that were read.")
    rows: int = Field(description="Rows read from them.")
    ngram: int
    min_overlap: float
    flagged_by_canonical_form: int = Field(0, description="Flagged items whose canonical form (not only their n-grams) occurs in a row.")
    harness_archives: int = Field(0, description="Harness archives read: the final system's and every other one the run uploaded.")
    harness_findings: list[str] = Field(default_factory=list, description="Per archive (`har_…: why`), the solution material it carries: "
                                        "hidden test items, gold patches, a swe project's released library, a terminal family's answer code. "
                                        "The operator's to read.")


class LeaderboardEntry(BaseModel):
    """Per run and task, the submission that counts on the leaderboard (the latest graded one; until one is graded,
    the latest one) with its aggregate test score. No per-item data."""

    submission_id: str
    run_id: str
    task_id: str = Field(description="The grader's id of the task.")
    status: Literal["queued", "running", "graded", "failed"]
    score: Score | None = None
    model_free_score: Score | None = Field(None, description="The null-model ablation's score (null until graded, and for a submission "
                                                             "without one: the evaluator track's, or one made before the ablation).")
    graded_at: dt.datetime | None = None
    validation_evaluations: int = Field(description="Validation evaluations the run has started, over all its tasks.")
    contamination: ContaminationReport | None = Field(None, description="The audit's counts (never which items); null until audited.")
    grade: EvaluatorGrade | None = Field(None, description="An evaluator's final submission (the evaluator track): its grade.")


class RolloutModels(BaseModel):
    """OpenAI's model list, as the rollout model endpoint (:mod:`grader.model_endpoint`) answers ``GET /v1/models``:
    the one model the rollout may call."""

    object: Literal["list"] = "list"
    data: list[ModelOut]
