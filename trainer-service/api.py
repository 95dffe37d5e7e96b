"""Internal routes of the trainer: thin routes over ``datasets`` and ``jobs`` with the app's :class:`Trainer`.

Every route needs the token of a service the trainer trusts (401 otherwise); all but ``get_checkpoint`` also act
for a signed run context (401 without one). Errors are raised, never formatted here; the shared handler renders
them as problem+json.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends, Header, Query, Request, Response
from trainer_service import datasets, jobs, sessions
from trainer_service.schemas import (
    CheckpointRecord,
    FutureOut,
    LiveModelCreate,
    LiveModelInfo,
    RequestAnswer,
    SamplerCreate,
    SamplerOut,
    SamplerSnapshot,
    SavedWeightsOut,
    SessionCreate,
    SessionOut,
)
from trainer_service.service import Trainer

from services.common.auth import RunCaller, ServiceCaller
from services.common.contracts import CheckpointOut, DatasetOut, JobEventOut, Page, Recipe, TrainingJobCreate, TrainingJobOut
from services.common.errors import BadRequest, Conflict, IdempotencyKeyReused, NotFound, PaymentRequired, Unauthorized, Unprocessable, problem_responses
from services.common.llms import base_model_dir


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


# --------------------------------------------------------------------------- Tinker's primitives (trainer_service.sessions)


@router.post("/primitives/sessions", status_code=201, summary="Open a session of Tinker's primitives")
def create_session(req: SessionCreate, trainer: TrainerDep, ctx: RunCaller) -> SessionOut:
    return SessionOut(session_id=sessions.create_session(trainer, ctx, req.user_metadata))


@router.post("/primitives/sessions/{session_id}/heartbeat", summary="A session's heartbeat", responses=problem_responses(NotFound))
def session_heartbeat(session_id: str, trainer: TrainerDep, ctx: RunCaller) -> SessionOut:
    """``alive: false`` once the session has finished."""
    return SessionOut(session_id=session_id, alive=sessions.heartbeat(trainer, ctx, session_id))


@router.post("/primitives/sessions/{session_id}/finish", summary="End a session", responses=problem_responses(NotFound))
def finish_session(session_id: str, trainer: TrainerDep, ctx: RunCaller) -> SessionOut:
    sessions.finish_session(trainer, ctx, session_id)
    return SessionOut(session_id=session_id, alive=False)


@router.post("/primitives/models", status_code=201, summary="Create a live model (Tinker's create_model, or create-via-load with path)",
             responses=problem_responses(BadRequest, NotFound, Conflict, Unprocessable))
def create_live_model(req: LiveModelCreate, trainer: TrainerDep, ctx: RunCaller) -> FutureOut:
    recipe = Recipe(**req.recipe)
    if req.path is not None:
        model_id = sessions.load_into_new_model(trainer, ctx, req.session_id, req.model_seq_id, req.path, req.optimizer, recipe)
        return FutureOut(request_id=sessions.completed(trainer, ctx, model_id, "load_weights", {"path": req.path, "model_id": model_id,
                                                                                                 "type": "load_weights"}), model_id=model_id)
    if req.base_model is None:
        raise BadRequest("base_model is required", field="base_model")
    model_id = sessions.create_model(trainer, ctx, req.session_id, req.model_seq_id, req.base_model, req.lora.model_dump(), recipe)
    return FutureOut(request_id=sessions.completed(trainer, ctx, model_id, "create_model", {"model_id": model_id, "type": "create_model"}),
                     model_id=model_id)


@router.get("/primitives/models/{model_id}", summary="A live model (Tinker's get_info)", responses=problem_responses(NotFound))
def live_model_info(model_id: str, trainer: TrainerDep, ctx: RunCaller) -> LiveModelInfo:
    info = sessions.model_info(trainer, ctx, model_id)
    return LiveModelInfo(**info, tokenizer_dir=str(base_model_dir(info["base_model"], trainer.settings.models_dir)))


@router.get("/primitives/models/{model_id}/weights", summary="The weights a live model saved", responses=problem_responses(NotFound))
def live_model_weights(model_id: str, trainer: TrainerDep, ctx: RunCaller) -> Page[SavedWeightsOut]:
    return Page[SavedWeightsOut](data=[SavedWeightsOut(path=w.path, kind=w.kind, checkpoint_id=w.checkpoint_id, created_at=w.created_at)  # type: ignore[arg-type]
                                       for w in sessions.weights_of(trainer, ctx, model_id)])


@router.post("/primitives/forward_backward", status_code=201, summary="Queue a forward(-backward) (protobuf ForwardBackwardRequest)",
             responses=problem_responses(BadRequest, NotFound, Conflict, PaymentRequired))
def forward_backward(trainer: TrainerDep, ctx: RunCaller,
                     body: bytes = Body(b"", media_type="application/x-protobuf", description="Tinker's ForwardBackwardRequest")) -> FutureOut:
    """Its tokens are held on the run's budget (402 when they cannot be), then it runs in the model's ``seq`` order."""
    return FutureOut(request_id=sessions.submit_forward_backward(trainer, ctx, body))


@router.post("/primitives/training/{kind}", status_code=201, summary="Queue a training request (optim_step, save_weights, save_weights_for_sampler, load_weights)",
             responses=problem_responses(BadRequest, NotFound, Conflict))
def training_request(kind: Literal["optim_step", "save_weights", "save_weights_for_sampler", "load_weights"], body: dict[str, Any],
                     trainer: TrainerDep, ctx: RunCaller) -> FutureOut:
    """``body`` as Tinker's SDK sends it (``model_id``, ``seq_id`` and the request's own fields)."""
    return FutureOut(request_id=sessions.submit_training(trainer, ctx, kind, body), model_id=str(body.get("model_id")))


@router.post("/primitives/samplers", status_code=201, summary="Create a sampler (Tinker's create_sampling_session)",
             responses=problem_responses(BadRequest, NotFound, Conflict, Unprocessable))
def create_sampler(req: SamplerCreate, trainer: TrainerDep, ctx: RunCaller) -> SamplerOut:
    sampler_id = sessions.create_sampler(trainer, ctx, req.session_id, req.sampling_session_seq_id, model_path=req.model_path, base_model=req.base_model)
    return get_sampler(sampler_id, trainer, ctx)


@router.post("/primitives/samplers/snapshot", status_code=201, summary="A sampler of a live model's weights (save_weights_and_get_sampling_client)",
             responses=problem_responses(NotFound, Conflict))
def sampler_snapshot(req: SamplerSnapshot, trainer: TrainerDep, ctx: RunCaller) -> FutureOut:
    request_id, sampler_id = sessions.submit_sampler_snapshot(trainer, ctx, req.model_id, req.seq_id, req.sampling_session_seq_id)
    return FutureOut(request_id=request_id, model_id=req.model_id, sampler_id=sampler_id)


@router.get("/primitives/samplers/{sampler_id}", summary="A sampler", responses=problem_responses(NotFound))
def get_sampler(sampler_id: str, trainer: TrainerDep, ctx: RunCaller) -> SamplerOut:
    with trainer.db.session() as s:
        found = sessions.sampler(s, ctx, sampler_id)
        return SamplerOut(sampler_id=found.id, base_model=found.base_model, model_path=found.model_path)


@router.post("/primitives/samplers/{sampler_id}/sample", status_code=201, summary="Queue a sample (Tinker's asample)",
             responses=problem_responses(BadRequest, NotFound, PaymentRequired))
def sample(sampler_id: str, body: dict[str, Any], trainer: TrainerDep, ctx: RunCaller) -> FutureOut:
    """Its worst case (prompt and ``max_tokens`` per sample) is held; the tokens generated are charged."""
    return FutureOut(request_id=sessions.submit_sample(trainer, ctx, sampler_id, body), sampler_id=sampler_id)


@router.get("/primitives/requests/{request_id}", summary="A request's answer, waiting for it (Tinker's retrieve_future)",
            responses=problem_responses(NotFound))
def retrieve_request(request_id: str, trainer: TrainerDep, ctx: RunCaller, wait_s: float = Query(0.0, ge=0, le=30)) -> RequestAnswer:
    """Waits up to ``wait_s`` seconds for the request to end; ``pending`` after that."""
    answer = sessions.retrieve(trainer, ctx, request_id, wait_s)
    if answer.status == "done" and answer.proto:
        return RequestAnswer(status="done", proto_b64=base64.b64encode(answer.result).decode())
    return RequestAnswer(status=answer.status, result=answer.result, error=answer.error, category=answer.category)  # type: ignore[arg-type]
