"""Internal routes of the grader: thin routes over the :class:`grader.service.Grader` (``app.state.grader``). Test
items, test trajectories and per-item test scores have no route.

Every route requires the token of a service the grader trusts; run-scoped ones also the signed run context (401
otherwise). Errors are raised, never formatted here; the shared handler renders them as problem+json.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Query, Request, Response

from grader import evaluations, graders, grading_tasks, harness_archives, imports, rewards, submissions
from grader.schemas import LeaderboardEntry, SubmissionGrading, TaskRegistered
from grader.service import Grader
from services.common.auth import RunCaller, ServiceCaller, only_callers
from services.common.contracts import (
    COLLECTION_NAME,
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
    SubmissionOut,
    SuiteItemOut,
    TaskCollectionOut,
    TrajectoryOut,
)
from services.common.errors import (
    Conflict,
    EvaluationRateLimited,
    FailedEvaluationLimit,
    NotFound,
    PayloadTooLarge,
    PaymentRequired,
    SubmissionLimitReached,
    Unauthorized,
    Unprocessable,
    UpstreamUnavailable,
    problem_responses,
)
from services.common.graders import GraderResult, GraderRunRequest


def get_grader(request: Request) -> Grader:
    """The app's :class:`Grader`, built by its lifespan."""
    return request.app.state.grader


GraderDep = Annotated[Grader, Depends(get_grader)]

router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized), dependencies=[Depends(only_callers("gateway"))])
"""The routes the gateway calls (for agents, operators and the leaderboard)."""

training_pool_router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized), dependencies=[Depends(only_callers("trainer"))])
"""GRPO's environment, for the trainer's train workers alone: the training pool's prompts and rewards."""

graders_router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized), dependencies=[Depends(only_callers("gateway", "trainer"))])
"""OpenAI-style graders, for the gateway (OpenAI's ``graders.run``) and the trainer (a graded GRPO job's rewards)."""


@router.post("/tasks", status_code=201, summary="Register a grading task (one task of a benchmark)", responses=problem_responses(Unprocessable, Conflict))
def register_task(spec: GradingSpec, grader: GraderDep, _caller: ServiceCaller) -> TaskRegistered:
    """Queue the build of the splits (the hidden test split into the test store; then the baseline evaluations are
    queued) on an eval worker and answer at once, ``splits`` ``building``. Idempotent on ``task_id``; 409 for another
    spec under it."""
    return grading_tasks.register_task(grader, spec)


@router.get("/tasks/{task_id}", summary="A grading task's split sizes and baseline test scores", responses=problem_responses(NotFound))
def task_status(task_id: str, grader: GraderDep, _caller: ServiceCaller) -> GradingTaskStatus:
    return grading_tasks.task_status(grader, task_id)


@router.get("/suite/train-sample", summary="Items of the training pool")
def train_sample(grader: GraderDep, ctx: RunCaller, offset: int = Query(0, ge=0, le=2**31), limit: int = Query(100, ge=1, le=10_000)) -> Page[SuiteItemOut]:
    return Page[SuiteItemOut](data=grading_tasks.train_sample(grader, ctx, offset, limit))


@router.get("/suite/candidate-scores", summary="A development target's score of each candidate", responses=problem_responses(NotFound))
def candidate_scores(grader: GraderDep, ctx: RunCaller) -> Page[CandidateScore]:
    return Page[CandidateScore](data=grading_tasks.development_scores(grader, ctx))


@router.get("/suite/validation", summary="The visible validation items")
def validation(grader: GraderDep, ctx: RunCaller) -> Page[SuiteItemOut]:
    return Page[SuiteItemOut](data=grading_tasks.validation_items(grader, ctx))


@training_pool_router.post("/training-pool/prompts", summary="The training pool's prompts as a harness renders them (GRPO's prompts)",
                           responses=problem_responses(Unprocessable, NotFound))
def pool_prompts(req: PoolPromptsRequest, grader: GraderDep, ctx: RunCaller) -> Page[PoolPrompt]:
    """Every training-pool item's chat messages; 422 field ``suite`` for a multi-turn suite, ``harness…`` for a bad harness."""
    return Page[PoolPrompt](data=rewards.pool_prompts(grader, ctx, req))


@training_pool_router.post("/training-pool/rewards", summary="Rewards of completions of training-pool items (GRPO's rewards; not charged)",
                           responses=problem_responses(Unprocessable, NotFound))
def pool_rewards(req: RewardRequest, grader: GraderDep, ctx: RunCaller) -> Page[Reward]:
    """One reward per completion, in order; 422 field ``completions[i].item_id`` for an id that is no training-pool item."""
    return Page[Reward](data=rewards.score_completions(grader, ctx, req))


@graders_router.post("/graders/run", summary="Rewards of samples by an OpenAI-style grader (a graded GRPO job's; OpenAI's graders.run)",
                     responses=problem_responses(Unprocessable, PaymentRequired, NotFound, UpstreamUnavailable))
def run_grader(req: GraderRunRequest, grader: GraderDep, ctx: RunCaller) -> Page[GraderResult]:
    """One result per sample, in order; a sample the grader cannot score is 0.0 with its ``error``. A model grader's
    calls are charged to the run by inference: its 402, 404 (unknown model) and 422 pass through; 503 when inference
    cannot be reached or no sandbox can run a ``python`` grader here."""
    return Page[GraderResult](data=graders.run_grader(grader, ctx, req))


@router.post("/evaluations", status_code=201, summary="Queue a validation evaluation",
             responses=problem_responses(Unprocessable, PaymentRequired, EvaluationRateLimited, FailedEvaluationLimit))
def create_evaluation(req: EvaluationCreate, limits: Annotated[EvaluationLimits, Query()], grader: GraderDep, ctx: RunCaller) -> EvaluationOut:
    """Queue it under the task's ``limits`` (query parameters, as the gateway read them from the benchmark)."""
    return evaluations.create_evaluation(grader, ctx, req, limits)


@router.get("/evaluations/usage", summary="The run's use of its evaluation allowance")
def evaluation_usage(grader: GraderDep, ctx: RunCaller) -> EvaluationUsage:
    return evaluations.usage_of(grader, ctx)


@router.get("/evaluations", summary="The run's validation evaluations")
def list_evaluations(grader: GraderDep, ctx: RunCaller) -> Page[EvaluationOut]:
    return Page[EvaluationOut](data=evaluations.list_evaluations(grader, ctx))


@router.get("/evaluations/{eval_id}", summary="One validation evaluation", responses=problem_responses(NotFound))
def get_evaluation(eval_id: str, grader: GraderDep, ctx: RunCaller) -> EvaluationOut:
    return evaluations.get_evaluation(grader, ctx, eval_id)


@router.get("/evaluations/{eval_id}/trajectories", summary="Per-item validation trajectories", responses=problem_responses(NotFound))
def get_trajectories(eval_id: str, grader: GraderDep, ctx: RunCaller) -> Page[TrajectoryOut]:
    return Page[TrajectoryOut](data=evaluations.trajectories(grader, ctx, eval_id))


@router.post("/submissions", status_code=201, summary="Submit the final system", responses=problem_responses(Unprocessable, SubmissionLimitReached))
def create_submission(req: SubmissionGrading, grader: GraderDep, ctx: RunCaller, max_submissions: int = Query(1, ge=0)) -> SubmissionOut:
    return submissions.create_submission(grader, ctx, req, max_submissions)


@router.get("/submissions", summary="The run's submissions")
def list_submissions(grader: GraderDep, ctx: RunCaller) -> Page[SubmissionOut]:
    return Page[SubmissionOut](data=submissions.list_submissions(grader, ctx))


@router.get("/submissions/{sub_id}", summary="One submission", responses=problem_responses(NotFound))
def get_submission(sub_id: str, grader: GraderDep, ctx: RunCaller) -> SubmissionOut:
    return submissions.get_submission(grader, ctx, sub_id)


@router.get("/leaderboard", summary="Per run and task, the submission that counts (latest graded) with its aggregate test score")
def leaderboard(grader: GraderDep, _caller: ServiceCaller) -> Page[LeaderboardEntry]:
    return Page[LeaderboardEntry](data=submissions.leaderboard_entries(grader))


@router.post("/harnesses", status_code=201, summary="Upload a code harness archive", responses=problem_responses(Unprocessable, PayloadTooLarge))
def upload_harness(grader: GraderDep, ctx: RunCaller,
                   body: bytes = Body(b"", media_type="application/gzip", description="The .tar.gz archive (grader.harness_archives states the format)"),
                   name: str | None = Query(None, max_length=200)) -> HarnessArchiveOut:
    """Validate and store an archive for the run; 422 names the ``member`` (``field: file``) or the manifest key."""
    return harness_archives.store_archive(grader, ctx.run_id, body, name=name)


@router.get("/harnesses", summary="The run's harness archives, then the suites' own")
def list_harnesses(grader: GraderDep, ctx: RunCaller) -> Page[HarnessArchiveOut]:
    return Page[HarnessArchiveOut](data=harness_archives.list_archives(grader, ctx))


@router.get("/harnesses/{harness_id}", summary="One harness archive", responses=problem_responses(NotFound))
def get_harness(harness_id: str, grader: GraderDep, ctx: RunCaller) -> HarnessArchiveOut:
    return harness_archives.get_archive(grader, ctx, harness_id)


@router.get("/harnesses/{harness_id}/archive", summary="A harness archive's .tar.gz", response_class=Response,
            responses={200: {"content": {"application/gzip": {}}}} | problem_responses(NotFound))
def harness_archive(harness_id: str, grader: GraderDep, ctx: RunCaller) -> Response:
    """The stored bytes of the run's archive or a suite's own (to start an edited copy)."""
    return Response(harness_archives.archive_bytes(grader, ctx, harness_id), media_type="application/gzip")



@router.post("/task-collections", status_code=201, summary="Import a collection of tasks (the operator's own; for hidden test splits)",
             responses=problem_responses(Unprocessable, Conflict, PayloadTooLarge))
def import_tasks(grader: GraderDep, body: bytes = Body(b"", media_type="application/gzip", description="A .tar.gz of one folder (grader.imports states the format)"),
                 name: str = Query(..., pattern=COLLECTION_NAME), suite: str = Query(..., pattern="^(terminal|swe)$")) -> TaskCollectionOut:
    """Stored in the test store, each task queued for validation in the sandbox; 409 (``name``) if the collection exists."""
    return imports.import_collection(grader, name, suite, body)


@router.get("/task-collections", summary="The imported task collections")
def list_task_collections(grader: GraderDep) -> Page[TaskCollectionOut]:
    return Page[TaskCollectionOut](data=imports.list_collections(grader))


@router.get("/task-collections/{name}", summary="An imported task collection and each task's validation", responses=problem_responses(NotFound))
def task_collection(name: str, grader: GraderDep) -> TaskCollectionOut:
    return imports.collection_out(grader, name)
