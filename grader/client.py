"""The grader's typed client: the only code that spells the grader's ``/internal/…`` paths.

Methods are named as the routes in :mod:`grader.api`; run-scoped ones take the run context ``ctx`` first.
They return the routes' response models and raise what the transport raises: ``UpstreamProblem`` carrying the
grader's problem+json (404 unknown task or evaluation, 422 bad model or harness, 402 from the ledger's hold,
429/403 evaluation limits, 403 submission limit, 401 without the service token or run context) and
``UpstreamUnavailable`` (503) while the grader cannot be reached.
"""

from __future__ import annotations

from typing import Any

from grader.schemas import DatasetDigest, LeaderboardEntry, SubmissionGrading, TaskRegistered
from services.common.auth import RunContext
from services.common.contracts import (
    CandidateScore,
    EvaluationCreate,
    EvaluationLimits,
    EvaluationOut,
    EvaluationUsage,
    GradingSpec,
    GradingTaskStatus,
    HarnessArchiveOut,
    Page,
    PoolPrompt,
    PoolPromptsRequest,
    Reward,
    RewardRequest,
    SubmissionCreate,
    SubmissionOut,
    SuiteItemOut,
    TaskCollectionOut,
    TrajectoryOut,
)
from services.common.graders import GraderResult, GraderRunRequest
from services.common.http import ServiceAPI, ServiceClient, Transport
from services.common.settings import ServiceSettings


class GraderClient(ServiceAPI):
    """The grader's internal API; with an :class:`AsyncServiceClient` transport every method returns an awaitable."""

    @classmethod
    def connect(cls, settings: ServiceSettings, transport: type[Transport] = ServiceClient, **overrides: Any) -> GraderClient:
        """A client of ``settings.grader_url`` with this service's token; a call may take 300 s in all (an upload, a
        model grader's samples); ``overrides`` go to the transport (e.g. ``timeout_s``)."""
        options = {"name": "grader", "timeout_s": 300} | overrides
        return cls(transport(settings.grader_url, settings.service_token, **options))

    def register_task(self, body: GradingSpec) -> TaskRegistered:
        """Register one grading task, answered at once: its splits are built in the background (``splits``
        ``building`` → ``ready`` or ``failed``, :meth:`task_status`), then its baselines queued. Idempotent on
        ``body.task_id`` (the same spec again: the same task, nothing built or graded twice; a failed build is queued
        again); 409 (``task_id``) for another spec under that id; 422 names the field for an unknown suite, bad suite
        params or a bad harness."""
        return self._call("POST", "/internal/tasks", TaskRegistered, body=body)

    def import_tasks(self, name: str, suite: str, content: bytes) -> TaskCollectionOut:
        """Import the ``.tar.gz`` ``content`` as collection ``name`` of ``suite`` tasks (:mod:`grader.imports`); 422 names
        the field, 409 (``name``) if the collection exists."""
        return self._call("POST", "/internal/task-collections", TaskCollectionOut, content=content, params={"name": name, "suite": suite},
                          headers={"Content-Type": "application/gzip"})

    def task_collections(self) -> Page[TaskCollectionOut]:
        return self._call("GET", "/internal/task-collections", Page[TaskCollectionOut])

    def task_collection(self, name: str) -> TaskCollectionOut:
        """One collection and its tasks' validation; 404 if there is none."""
        return self._call("GET", f"/internal/task-collections/{name}", TaskCollectionOut)

    def task_status(self, task_id: str) -> GradingTaskStatus:
        """Split sizes and baseline test scores of task ``task_id``; 404 if it is not registered."""
        return self._call("GET", f"/internal/tasks/{task_id}", GradingTaskStatus)

    def train_sample(self, ctx: RunContext, *, offset: int = 0, limit: int = 100) -> Page[SuiteItemOut]:
        """Items ``[offset, offset + limit)`` of the run's task's training pool."""
        return self._call("GET", "/internal/suite/train-sample", Page[SuiteItemOut], ctx=ctx, params={"offset": offset, "limit": limit})

    def candidate_scores(self, ctx: RunContext) -> Page[CandidateScore]:
        """The run's task's score of each candidate, the task being a development target of the evaluator track (404 otherwise)."""
        return self._call("GET", "/internal/suite/candidate-scores", Page[CandidateScore], ctx=ctx)

    def validation(self, ctx: RunContext) -> Page[SuiteItemOut]:
        """Every visible validation item of the run's task."""
        return self._call("GET", "/internal/suite/validation", Page[SuiteItemOut], ctx=ctx)

    def pool_prompts(self, ctx: RunContext, body: PoolPromptsRequest) -> Page[PoolPrompt]:
        """Every item of the run's task's training pool with the chat messages ``body.harness`` renders for it (default: the
        initial system's harness); 422 field ``suite`` for a multi-turn suite, ``harness…`` for a harness that cannot be used."""
        return self._call("POST", "/internal/training-pool/prompts", Page[PoolPrompt], ctx=ctx, body=body)

    def pool_rewards(self, ctx: RunContext, body: RewardRequest) -> Page[Reward]:
        """The suite's reward of each completion of a training-pool item, in order (not charged); 422 field
        ``completions[i].item_id`` for an id that is no item of the training pool, and as :meth:`pool_prompts`."""
        return self._call("POST", "/internal/training-pool/rewards", Page[Reward], ctx=ctx, body=body)

    def run_grader(self, ctx: RunContext, body: GraderRunRequest) -> Page[GraderResult]:
        """``body.grader``'s result for each of ``body.samples``, in order (a sample it cannot score: 0.0 and its
        ``error``); a model grader's calls are charged to the run, so 402 when its budget cannot pay them, 404 for a model
        inference does not serve, 422 naming a field, 503 when inference or the grader's sandbox is unavailable."""
        return self._call("POST", "/internal/graders/run", Page[GraderResult], ctx=ctx, body=body)

    def create_evaluation(self, ctx: RunContext, body: EvaluationCreate, *, limits: EvaluationLimits) -> EvaluationOut:
        """Queue a validation evaluation under the task's ``limits`` (a ``None`` limit is left out: the grader's default)."""
        return self._call("POST", "/internal/evaluations", EvaluationOut, ctx=ctx, body=body, params=limits.model_dump())

    def evaluation_usage(self, ctx: RunContext) -> EvaluationUsage:
        """The run's use of its evaluation allowance."""
        return self._call("GET", "/internal/evaluations/usage", EvaluationUsage, ctx=ctx)

    def list_evaluations(self, ctx: RunContext) -> Page[EvaluationOut]:
        """The run's validation evaluations, oldest first."""
        return self._call("GET", "/internal/evaluations", Page[EvaluationOut], ctx=ctx)

    def get_evaluation(self, ctx: RunContext, eval_id: str) -> EvaluationOut:
        """One of the run's validation evaluations; 404 for any other id."""
        return self._call("GET", f"/internal/evaluations/{eval_id}", EvaluationOut, ctx=ctx)

    def get_trajectories(self, ctx: RunContext, eval_id: str) -> Page[TrajectoryOut]:
        """Per-item trajectories of one of the run's validation evaluations; 404 for any other id."""
        return self._call("GET", f"/internal/evaluations/{eval_id}/trajectories", Page[TrajectoryOut], ctx=ctx)

    def create_submission(self, ctx: RunContext, body: SubmissionCreate, *, max_submissions: int, datasets: list[DatasetDigest]) -> SubmissionOut:
        """Submit the run's final system for the task with the run's ``datasets`` (what its contamination audit reads);
        403 ``submission_limit`` once ``max_submissions`` are used up."""
        grading = SubmissionGrading(**body.model_dump(exclude_unset=True), datasets=datasets)
        return self._call("POST", "/internal/submissions", SubmissionOut, ctx=ctx, body=grading, params={"max_submissions": max_submissions})

    def list_submissions(self, ctx: RunContext) -> Page[SubmissionOut]:
        """The run's submissions, oldest first."""
        return self._call("GET", "/internal/submissions", Page[SubmissionOut], ctx=ctx)

    def get_submission(self, ctx: RunContext, sub_id: str) -> SubmissionOut:
        """One of the run's submissions; 404 for any other id."""
        return self._call("GET", f"/internal/submissions/{sub_id}", SubmissionOut, ctx=ctx)

    def upload_harness(self, ctx: RunContext, content: bytes, *, name: str | None = None) -> HarnessArchiveOut:
        """Store the ``.tar.gz`` ``content`` for the run; 422 names the faulty ``member`` or manifest key."""
        return self._call("POST", "/internal/harnesses", HarnessArchiveOut, ctx=ctx, content=content, params={"name": name},
                          headers={"Content-Type": "application/gzip"})

    def list_harnesses(self, ctx: RunContext) -> Page[HarnessArchiveOut]:
        return self._call("GET", "/internal/harnesses", Page[HarnessArchiveOut], ctx=ctx)

    def get_harness(self, ctx: RunContext, harness_id: str) -> HarnessArchiveOut:
        return self._call("GET", f"/internal/harnesses/{harness_id}", HarnessArchiveOut, ctx=ctx)

    def harness_archive(self, ctx: RunContext, harness_id: str) -> bytes:
        """The archive's ``.tar.gz`` bytes."""
        return self._call("GET", f"/internal/harnesses/{harness_id}/archive", ctx=ctx, raw=True)

    def leaderboard(self) -> Page[LeaderboardEntry]:
        """Per run and task, the submission that counts with its aggregate test score."""
        return self._call("GET", "/internal/leaderboard", Page[LeaderboardEntry])
