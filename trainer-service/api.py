"""Internal routes of the trainer. Every route needs the service token and acts for the signed run context."""

from __future__ import annotations

from fastapi import APIRouter, Body, Depends, Header, Query, Response
from trainer_service import service

from services.common.auth import InternalAuth, RunContext
from services.common.contracts import CheckpointOut, DatasetOut, JobEventOut, Page, TrainingJobCreate, TrainingJobOut
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses

auth = InternalAuth(lambda: service.runtime().settings.trusted_tokens)
router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized))


@router.post("/datasets", status_code=201, summary="Upload a JSONL dataset", responses=problem_responses(Unprocessable))
def upload_dataset(
    body: bytes = Body(b"", media_type="application/jsonl", description="JSONL file content (an empty body is an empty file: 422 on `file`)"),
    name: str = Query("dataset.jsonl", max_length=200),
    ctx: RunContext = Depends(auth.run),
) -> DatasetOut:
    """Validate and store a JSONL file for the run; 422 names the first bad ``line`` and ``field`` (``file`` for
    the file as a whole: empty, not UTF-8, not JSON Lines)."""
    return service.create_dataset(ctx, name, body)


@router.get("/datasets", summary="List the run's datasets")
def list_datasets(ctx: RunContext = Depends(auth.run)) -> Page[DatasetOut]:
    return Page[DatasetOut](data=service.list_datasets(ctx))


@router.get("/datasets/{dataset_id}", summary="Get one dataset", responses=problem_responses(NotFound))
def get_dataset(dataset_id: str, ctx: RunContext = Depends(auth.run)) -> DatasetOut:
    return service.get_dataset(ctx, dataset_id)


@router.get("/datasets/{dataset_id}/content", summary="A dataset's JSONL content (for the grader's audit)", response_class=Response,
            responses={200: {"content": {"application/jsonl": {}}}} | problem_responses(NotFound))
def dataset_content(dataset_id: str, ctx: RunContext = Depends(auth.run)) -> Response:
    """The run's dataset exactly as stored (JSONL bytes). Internal only: the grader reads it for the contamination audit."""
    return Response(service.dataset_content(ctx, dataset_id), media_type="application/jsonl")


@router.post("/jobs", status_code=201, summary="Create a training job", responses=problem_responses(Unprocessable, NotFound, PaymentRequired, IdempotencyKeyReused))
def create_job(
    req: TrainingJobCreate,
    ctx: RunContext = Depends(auth.run),
    idempotency_key: str | None = Header(None, min_length=1, max_length=150, pattern=r"^[!-~]+$", description="Repeat-safe creation: the same key returns the same job."),
) -> TrainingJobOut:
    """Validate, hold the estimated cost on the run's budget, and queue the job."""
    return service.create_job(ctx, req, idempotency_key)


@router.get("/jobs", summary="List the run's training jobs")
def list_jobs(ctx: RunContext = Depends(auth.run)) -> Page[TrainingJobOut]:
    return Page[TrainingJobOut](data=service.list_jobs(ctx))


@router.get("/jobs/{job_id}", summary="Get a training job", responses=problem_responses(NotFound))
def get_job(job_id: str, ctx: RunContext = Depends(auth.run)) -> TrainingJobOut:
    return service.get_job(ctx, job_id)


@router.get("/jobs/{job_id}/events", summary="A training job's events", responses=problem_responses(NotFound))
def job_events(job_id: str, after: int = Query(0, ge=0, le=2**62, description="Return events with seq > after"), limit: int = Query(500, ge=1, le=5000),
               ctx: RunContext = Depends(auth.run)) -> Page[JobEventOut]:
    return Page[JobEventOut](data=service.list_events(ctx, job_id, after, limit))


@router.get("/jobs/{job_id}/checkpoints", summary="A training job's checkpoints", responses=problem_responses(NotFound))
def job_checkpoints(job_id: str, ctx: RunContext = Depends(auth.run)) -> Page[CheckpointOut]:
    return Page[CheckpointOut](data=service.list_checkpoints(ctx, job_id))


@router.post("/jobs/{job_id}/cancel", summary="Cancel a training job", responses=problem_responses(NotFound, Conflict))
def cancel_job(job_id: str, ctx: RunContext = Depends(auth.run)) -> TrainingJobOut:
    return service.cancel_job(ctx, job_id)


@router.get("/checkpoints/{checkpoint_id}", summary="Locate a checkpoint (for inference)", responses=problem_responses(NotFound))
def get_checkpoint(checkpoint_id: str, ctx: RunContext | None = Depends(auth.caller)) -> dict:
    """``{id, run_id, base_model, uri, kind, step}``; with a run context, only that run's checkpoints exist."""
    return service.checkpoint_record(checkpoint_id, ctx.run_id if ctx else None)
