"""Internal routes of the trainer: thin routes over ``datasets`` and ``jobs`` with the app's :class:`Trainer`.

Every route needs the token of a service the trainer trusts (401 otherwise); all but ``get_checkpoint`` also act
for a signed run context (401 without one). Errors are raised, never formatted here; the shared handler renders
them as problem+json.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from trainer_service import datasets, jobs
from trainer_service.schemas import CheckpointRecord
from trainer_service.service import Trainer

from services.common.auth import RunCaller, ServiceCaller
from services.common.contracts import CheckpointOut, DatasetOut, JobEventOut, Page, TrainingJobCreate, TrainingJobOut
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses


def get_trainer(request: Request) -> Trainer:
    return request.app.state.trainer


TrainerDep = Annotated[Trainer, Depends(get_trainer)]

router = APIRouter(prefix="/internal", responses=problem_responses(Unauthorized))


@router.post("/datasets", status_code=201, summary="Upload a JSONL dataset", responses=problem_responses(Unprocessable))
def upload_dataset(
    trainer: TrainerDep,
    ctx: RunCaller,
    body: bytes = Body(b"", media_type="application/jsonl", description="JSONL file content (an empty body is an empty file: 422 on `file`)"),
    name: str = Query("dataset.jsonl", max_length=200),
) -> DatasetOut:
    """Validate and store a JSONL file for the run; 422 names the first bad ``line`` and ``field`` (``file`` for
    the file as a whole: empty, not UTF-8, not JSON Lines)."""
    return datasets.create_dataset(trainer, ctx, name, body)


@router.get("/datasets", summary="List the run's datasets")
def list_datasets(trainer: TrainerDep, ctx: RunCaller) -> Page[DatasetOut]:
    return Page[DatasetOut](data=datasets.list_datasets(trainer, ctx))


@router.get("/datasets/{dataset_id}", summary="Get one dataset", responses=problem_responses(NotFound))
def get_dataset(dataset_id: str, trainer: TrainerDep, ctx: RunCaller) -> DatasetOut:
    return datasets.get_dataset(trainer, ctx, dataset_id)


@router.get("/datasets/{dataset_id}/content", summary="A dataset's JSONL content (for the grader's audit)", response_class=Response,
            responses={200: {"content": {"application/jsonl": {}}}} | problem_responses(NotFound))
def dataset_content(dataset_id: str, trainer: TrainerDep, ctx: RunCaller) -> Response:
    """The run's dataset exactly as stored (JSONL bytes). Internal only: the grader reads it for the contamination audit."""
    return Response(datasets.dataset_content(trainer, ctx, dataset_id), media_type="application/jsonl")


@router.post("/jobs", status_code=201, summary="Create a training job", responses=problem_responses(Unprocessable, NotFound, PaymentRequired, IdempotencyKeyReused))
def create_job(
    req: TrainingJobCreate,
    trainer: TrainerDep,
    ctx: RunCaller,
    idempotency_key: str | None = Header(None, min_length=1, max_length=150, pattern=r"^[!-~]+$", description="Repeat-safe creation: the same key returns the same job."),
) -> TrainingJobOut:
    """Validate, hold the estimated cost on the run's budget, and queue the job."""
    return jobs.create_job(trainer, ctx, req, idempotency_key)


@router.get("/jobs", summary="List the run's training jobs")
def list_jobs(trainer: TrainerDep, ctx: RunCaller) -> Page[TrainingJobOut]:
    return Page[TrainingJobOut](data=jobs.list_jobs(trainer, ctx))


@router.get("/jobs/{job_id}", summary="Get a training job", responses=problem_responses(NotFound))
def get_job(job_id: str, trainer: TrainerDep, ctx: RunCaller) -> TrainingJobOut:
    return jobs.get_job(trainer, ctx, job_id)


@router.get("/jobs/{job_id}/events", summary="A training job's events", responses=problem_responses(NotFound))
def job_events(job_id: str, trainer: TrainerDep, ctx: RunCaller, after: int = Query(0, ge=0, le=2**62, description="Return events with seq > after"),
               limit: int = Query(500, ge=1, le=5000)) -> Page[JobEventOut]:
    return Page[JobEventOut](data=jobs.list_events(trainer, ctx, job_id, after, limit))


@router.get("/jobs/{job_id}/checkpoints", summary="A training job's checkpoints", responses=problem_responses(NotFound))
def job_checkpoints(job_id: str, trainer: TrainerDep, ctx: RunCaller) -> Page[CheckpointOut]:
    return Page[CheckpointOut](data=jobs.list_checkpoints(trainer, ctx, job_id))


@router.post("/jobs/{job_id}/cancel", summary="Cancel a training job", responses=problem_responses(NotFound, Conflict))
def cancel_job(job_id: str, trainer: TrainerDep, ctx: RunCaller) -> TrainingJobOut:
    return jobs.cancel_job(trainer, ctx, job_id)


@router.get("/checkpoints/{checkpoint_id}", summary="Locate a checkpoint (for inference)", responses=problem_responses(NotFound))
def get_checkpoint(checkpoint_id: str, trainer: TrainerDep, ctx: ServiceCaller) -> CheckpointRecord:
    """Where the checkpoint's adapter lives; with a run context, only that run's checkpoints exist."""
    return jobs.checkpoint_record(trainer, checkpoint_id, ctx.run_id if ctx else None)
