"""Internal routes of the grader. Test items, test trajectories and per-item test scores have no route."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from grader import service
from grader.schemas import LeaderboardEntry, TaskRegistered
from services.common.auth import InternalAuth, RunContext
from services.common.contracts import (
    EvaluationCreate,
    EvaluationLimits,
    EvaluationOut,
    EvaluationUsage,
    GradingSpec,
    GradingTaskStatus,
    Page,
    SubmissionCreate,
    SubmissionOut,
    SuiteItemOut,
    TrajectoryOut,
)
from services.common.errors import (
    EvaluationRateLimited,
    FailedEvaluationLimit,
    NotFound,
    PaymentRequired,
    SubmissionLimitReached,
    Unauthorized,
    Unprocessable,
    problem_responses,
)

auth = InternalAuth(lambda: service.runtime().settings.trusted_tokens)
router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized))


@router.post("/benchmarks", status_code=201, summary="Register a benchmark's grading spec", responses=problem_responses(Unprocessable))
def register_task(spec: GradingSpec, _caller: RunContext | None = Depends(auth.caller)) -> TaskRegistered:
    """Build the splits (the hidden test split into the test store) and queue the baseline evaluations."""
    return service.register_benchmark(spec)


@router.get("/benchmarks/{benchmark_id}", summary="A benchmark's split sizes and baseline test scores", responses=problem_responses(NotFound))
def task_status(benchmark_id: str, _caller: RunContext | None = Depends(auth.caller)) -> GradingTaskStatus:
    return service.benchmark_status(benchmark_id)


@router.get("/suite/train-sample", summary="Items of the training pool")
def train_sample(offset: int = Query(0, ge=0, le=2**31), limit: int = Query(100, ge=1, le=10_000), ctx: RunContext = Depends(auth.run)) -> Page[SuiteItemOut]:
    return Page[SuiteItemOut](data=service.train_sample(ctx, offset, limit))


@router.get("/suite/validation", summary="The visible validation items")
def validation(ctx: RunContext = Depends(auth.run)) -> Page[SuiteItemOut]:
    return Page[SuiteItemOut](data=service.validation_items(ctx))


@router.post("/evaluations", status_code=201, summary="Queue a validation evaluation",
             responses=problem_responses(Unprocessable, PaymentRequired, EvaluationRateLimited, FailedEvaluationLimit))
def create_evaluation(req: EvaluationCreate, limits: Annotated[EvaluationLimits, Query()], ctx: RunContext = Depends(auth.run)) -> EvaluationOut:
    """Queue it under the benchmark's ``limits`` (query parameters, as the gateway read them from the benchmark)."""
    return service.create_evaluation(ctx, req, limits)


@router.get("/evaluations/usage", summary="The run's use of its evaluation allowance")
def evaluation_usage(ctx: RunContext = Depends(auth.run)) -> EvaluationUsage:
    return service.usage_of(ctx)


@router.get("/evaluations", summary="The run's validation evaluations")
def list_evaluations(ctx: RunContext = Depends(auth.run)) -> Page[EvaluationOut]:
    return Page[EvaluationOut](data=service.list_evaluations(ctx))


@router.get("/evaluations/{eval_id}", summary="One validation evaluation", responses=problem_responses(NotFound))
def get_evaluation(eval_id: str, ctx: RunContext = Depends(auth.run)) -> EvaluationOut:
    return service.get_evaluation(ctx, eval_id)


@router.get("/evaluations/{eval_id}/trajectories", summary="Per-item validation trajectories", responses=problem_responses(NotFound))
def get_trajectories(eval_id: str, ctx: RunContext = Depends(auth.run)) -> Page[TrajectoryOut]:
    return Page[TrajectoryOut](data=service.trajectories(ctx, eval_id))


@router.post("/submissions", status_code=201, summary="Submit the final system", responses=problem_responses(Unprocessable, SubmissionLimitReached))
def create_submission(req: SubmissionCreate, max_submissions: int = Query(1, ge=0), ctx: RunContext = Depends(auth.run)) -> SubmissionOut:
    return service.create_submission(ctx, req, max_submissions)


@router.get("/submissions", summary="The run's submissions")
def list_submissions(ctx: RunContext = Depends(auth.run)) -> Page[SubmissionOut]:
    return Page[SubmissionOut](data=service.list_submissions(ctx))


@router.get("/submissions/{sub_id}", summary="One submission", responses=problem_responses(NotFound))
def get_submission(sub_id: str, ctx: RunContext = Depends(auth.run)) -> SubmissionOut:
    return service.get_submission(ctx, sub_id)


@router.get("/leaderboard", summary="Per run and task, the submission that counts (latest graded) with its aggregate test score")
def leaderboard(_caller: RunContext | None = Depends(auth.caller)) -> Page[LeaderboardEntry]:
    return Page[LeaderboardEntry](data=service.leaderboard_entries())
