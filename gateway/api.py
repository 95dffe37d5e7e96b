"""Gateway routes: the agent API (``/v1``, run key), operator admin (``/admin``, admin key), public leaderboard.

Routes parse, authorize (a :class:`Caller` by ``Depends``), call the gateway's logic or the owning service's
typed client on the :class:`Gateway` the app built (``Depends(get_gateway)``), and return its schema. Errors
are raised, never formatted here; every route documents the problems it can answer with.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Cookie, Depends, FastAPI, File, Form, Header, Path, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from fastapi.templating import Jinja2Templates

from gateway import benchmarks, evaluator, finetuning, leaderboard, pages, reports, runs
from gateway.schemas import (
    BenchmarkOut,
    BudgetOut,
    CursorPage,
    FileObject,
    FineTuningCheckpointOut,
    FineTuningEventOut,
    FineTuningJobCreate,
    FineTuningJobOut,
    GraderRunOut,
    GraderRunParams,
    GraderValidateOut,
    GraderValidateParams,
    LeaderboardRow,
    NoteCreate,
    NoteOut,
    RefundRequest,
    RunCard,
    RunCreate,
    RunCreated,
    RunOut,
    RunReport,
)
from gateway.service import (
    Caller,
    Gateway,
    admit,
    audit_log,
    check_deadline,
    check_editable,
    episode_log,
    for_task,
    log_audit,
    log_call,
    log_note,
    run_caller,
    training_job,
)
from grader.schemas import DatasetDigest
from services.common.app import StrictBodyRoute, problem_json, validation_problem
from services.common.contracts import (
    COLLECTION_NAME,
    BenchmarkBaselines,
    CandidateScore,
    CheckpointOut,
    DatasetOut,
    EvaluationCreate,
    EvaluationOut,
    HarnessArchiveOut,
    JobEventOut,
    Page,
    SubmissionCreate,
    SubmissionOut,
    SuiteItemOut,
    TaskCollectionOut,
    TrainingJobCreate,
    TrainingJobOut,
    TrajectoryOut,
)
from services.common.errors import (
    BadRequest,
    BenchmarkNotReady,
    Conflict,
    EvaluationRateLimited,
    FailedEvaluationLimit,
    Forbidden,
    IdempotencyKeyReused,
    NotFound,
    OutsideEditableSpace,
    PayloadTooLarge,
    PaymentRequired,
    RunExpired,
    SubmissionLimitReached,
    TooManyRequests,
    Unauthorized,
    Unprocessable,
    UpstreamUnavailable,
    problem_responses,
)
from services.common.graders import GraderRunRequest, GraderSample
from services.common.llms import ModelCard, ModelPreparationError, parse_card
from services.common.openai_protocol import ChatCompletion, ChatCompletionRequest, Completion, CompletionRequest, ModelOut
from services.ledger.schemas import Balance, Entry, Refund

templates = Jinja2Templates(directory=FilePath(__file__).parent / "templates")

# --------------------------------------------------------------------------- dependencies


async def get_gateway(request: Request) -> Gateway:
    """The gateway the app built when it started (async: resolved on the event loop, without a thread)."""
    return request.app.state.gateway


GatewayDep = Annotated[Gateway, Depends(get_gateway)]


async def agent(request: Request, gw: GatewayDep, authorization: str | None = Header(None, description="`Bearer <run API key>`")) -> Caller:
    """The calling run (401 if the key is missing, unknown or revoked); marks the call for the episode log.

    429 past the key's rate limits, counted as the request arrives, before it waits for a thread or the database."""
    caller = await admit(gw, authorization, counted=request.app.state.mcp.counted(request))  # an MCP tool: its /mcp request counted
    request.state.run_id = caller.run.id
    return caller


AgentDep = Annotated[Caller, Depends(agent)]


async def mutating_agent(caller: AgentDep) -> Caller:
    """The calling run, for calls that change state: refused with 403 ``run_expired`` past the deadline."""
    check_deadline(caller)
    return caller


MutatingAgentDep = Annotated[Caller, Depends(mutating_agent)]


def admin(gw: GatewayDep, authorization: str | None = Header(None, description="`Bearer <admin key>`")) -> None:
    """Operator authorization with the admin key (never a run key)."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key.encode(), gw.settings.admin_key.encode()):
        raise Unauthorized("admin routes need the operator's admin key")


def episode_middleware(app: FastAPI) -> None:
    """Record every agent call (run, method, path, status, latency in ms) in the episode log, and every
    operator call and every refused credential (401) in the audit log."""

    @app.middleware("http")
    async def _episode(request: Request, call_next):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        response = await call_next(request)
        gw: Gateway = request.app.state.gateway
        run_id = getattr(request.state, "run_id", None)
        path = request.url.path
        if run_id:
            await run_in_threadpool(log_call, gw, run_id, request.method, path, response.status_code, int((time.perf_counter() - start) * 1000))
        elif path.startswith("/admin") or response.status_code == 401:
            _scheme, _, key = request.headers.get("authorization", "").partition(" ")
            actor = "admin" if path.startswith("/admin") and response.status_code != 401 else "anonymous"
            prefix = (key.strip()[:8] or None) if actor == "anonymous" else None  # never the whole key
            await run_in_threadpool(log_audit, gw, actor, prefix, request.method, path, response.status_code,
                                    request.client.host if request.client else None)
        return response


ID_PATTERN = r"^[a-z]{2,4}_[0-9a-z]{26}$"
DatasetId = Annotated[str, Path(pattern=ID_PATTERN, description="`ds_…`")]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="`job_…`")]
EvalId = Annotated[str, Path(pattern=ID_PATTERN, description="`eval_…`")]
SubId = Annotated[str, Path(pattern=ID_PATTERN, description="`sub_…`")]
RunId = Annotated[str, Path(pattern=ID_PATTERN, description="`run_…`")]
HarnessId = Annotated[str, Path(pattern=ID_PATTERN, description="`har_…`")]

AGENT_ERRORS = problem_responses(Unauthorized, TooManyRequests, UpstreamUnavailable)  # 503: a service is restarting; retry
MUTATING_ERRORS = problem_responses(Unauthorized, RunExpired, PaymentRequired)
agent_router = APIRouter(prefix="/v1", responses=AGENT_ERRORS, route_class=StrictBodyRoute)
TaskQuery = Query(None, min_length=1, max_length=64, examples=["math"],
                  description="The benchmark's task (see `GET /v1/run`); may be left out when the benchmark has one task.")
admin_router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(admin)], responses=problem_responses(Unauthorized),
                         route_class=StrictBodyRoute)
public_router = APIRouter(tags=["leaderboard"])

# --------------------------------------------------------------------------- run


@agent_router.get("/run", tags=["run"], summary="The run card")
async def get_run(gw: GatewayDep, caller: AgentDep) -> RunCard:
    """Benchmark card, track and editable space, recipe policy, evaluation settings, deadline, budget, limits."""
    return await runs.run_card(gw, caller)


@agent_router.get("/budget", tags=["run"], summary="Budget remaining and spent by kind")
async def get_budget(gw: GatewayDep, caller: AgentDep) -> BudgetOut:
    """Micro-USD: ``budget = remaining + held + spent``; ``spent_by_kind`` per usage kind. Works after exhaustion."""
    return await runs.budget(gw, caller)


@agent_router.get("/run/report", tags=["run"], summary="Where the run's time and money went, and what it tried")
async def get_run_report(gw: GatewayDep, caller: AgentDep) -> RunReport:
    """Wall time by activity (training, evaluating, queued, final grading, the agent's own; overlaps counted once in
    ``wall_s``, every job in ``busy_s``), the share spent waiting on queues and grading, spend over time by kind
    (micro-USD), the designs tried (datasets, recipes, harnesses, checkpoints) with their best validation score and cost,
    and each validation evaluation's score over time. Free; computed on each call."""
    return await reports.run_report(gw, caller)


@agent_router.post("/run/notes", status_code=201, tags=["run"], summary="Append a note to the run's episode log",
                   responses=problem_responses(Unauthorized, Unprocessable))
async def add_note(req: NoteCreate, request: Request, gw: GatewayDep, caller: AgentDep) -> NoteOut:
    """The agent's reasoning, a plan or a finding, kept in the episode log beside its calls (a row with method ``NOTE`` and
    the text; the operator reads it at ``/admin/runs/{id}/episode``). Free; 1 to 4,000 characters (422 naming ``text``
    otherwise). Works after the deadline, as reads do."""
    return NoteOut(**await run_in_threadpool(log_note, gw, caller.run.id, request.url.path, req.text))


# --------------------------------------------------------------------------- datasets and suite data


@agent_router.post("/datasets", status_code=201, tags=["datasets"], summary="Upload a JSONL dataset",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, PayloadTooLarge))
async def upload_dataset(gw: GatewayDep, caller: MutatingAgentDep,
                         file: UploadFile = File(..., description="JSONL: chat `messages`, or `prompt`/`completion`, or `prompt`/`chosen`/`rejected`"),
                         name: str | None = Form(None, max_length=200)) -> DatasetOut:
    """Validated on upload (422 names the ``line`` and ``field``), content-addressed and immutable."""
    return await store_upload(gw, caller, file, name)


async def store_upload(gw: Gateway, caller: Caller, file: UploadFile, name: str | None) -> DatasetOut:
    """Store an uploaded JSONL file as the run's dataset (``POST /v1/datasets``, ``POST /v1/files``): the data part of
    the run must be editable (403), the file at most ``max_upload_bytes`` (413); the trainer validates it (422)."""
    check_editable(caller, "data", "uploading a dataset")
    limit = gw.settings.max_upload_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"the file is larger than {limit} bytes", field="file")
    return await gw.trainer.upload_dataset(caller.ctx, data, name=name or file.filename or "dataset.jsonl")


@agent_router.get("/datasets", tags=["datasets"], summary="List the run's datasets")
async def list_datasets(gw: GatewayDep, caller: AgentDep) -> Page[DatasetOut]:
    return await gw.trainer.list_datasets(caller.ctx)


@agent_router.get("/datasets/{dataset_id}", tags=["datasets"], summary="Get a dataset", responses=problem_responses(NotFound))
async def get_dataset(dataset_id: DatasetId, gw: GatewayDep, caller: AgentDep) -> DatasetOut:
    return await gw.trainer.get_dataset(caller.ctx, dataset_id)


# --------------------------------------------------------------------------- harness archives


@agent_router.post("/harnesses", status_code=201, tags=["harnesses"], summary="Upload a code harness archive",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, PayloadTooLarge))
async def upload_harness(gw: GatewayDep, caller: MutatingAgentDep,
                         file: UploadFile = File(..., description="A .tar.gz with `harness.toml` at its root (name, entry, optional install "
                                                                  "and limits) and the harness's code; docs/harnesses.md states the format"),
                         name: str | None = Form(None, max_length=200)) -> HarnessArchiveOut:
    """Validated on upload (422 names the ``member``: absolute paths, ``..``, links out of the tree, device files,
    too many or too large members; or the ``harness.toml`` key), content-addressed and immutable. Needs the
    ``harness`` part editable. Use it with ``harness_archive`` in ``POST /v1/evaluations`` and ``/v1/submissions``."""
    check_editable(caller, evaluator.code_part(caller), "uploading a harness archive")
    limit = gw.settings.max_upload_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"the file is larger than {limit} bytes", field="file")
    return await gw.grader.upload_harness(caller.ctx, data, name=name)


@agent_router.get("/harnesses", tags=["harnesses"], summary="List the run's harness archives and the suites' own")
async def list_harnesses(gw: GatewayDep, caller: AgentDep) -> Page[HarnessArchiveOut]:
    """The run's uploads, oldest first, then the suites' own code harnesses (``platform: true``)."""
    return await gw.grader.list_harnesses(caller.ctx)


@agent_router.get("/harnesses/{harness_id}", tags=["harnesses"], summary="Get a harness archive's record", responses=problem_responses(NotFound))
async def get_harness(harness_id: HarnessId, gw: GatewayDep, caller: AgentDep) -> HarnessArchiveOut:
    return await gw.grader.get_harness(caller.ctx, harness_id)


@agent_router.get("/harnesses/{harness_id}/archive", tags=["harnesses"], summary="Download a harness archive", response_class=Response,
                  responses={200: {"content": {"application/gzip": {}}}} | problem_responses(NotFound))
async def download_harness(harness_id: HarnessId, gw: GatewayDep, caller: AgentDep) -> Response:
    """The ``.tar.gz`` as stored: the run's own, or a suite's (to start an edited copy from the default harness)."""
    return Response(await gw.grader.harness_archive(caller.ctx, harness_id), media_type="application/gzip")


@agent_router.get("/suite/train-sample", tags=["suite"], summary="Items of the suite's training pool")
async def train_sample(gw: GatewayDep, caller: AgentDep, offset: int = Query(0, ge=0, le=2**31), limit: int = Query(100, ge=1, le=10_000),
                       task: str | None = TaskQuery) -> Page[SuiteItemOut]:
    """Question/answer pairs of the task's public training pool, drawn from its train seed without the validation
    items; a function of the benchmark file alone (the hidden test split is drawn around it, never the reverse)."""
    return await gw.grader.train_sample(for_task(caller, task).ctx, offset=offset, limit=limit)


@agent_router.get("/suite/candidate-scores", tags=["suite"], summary="A development target's score of each candidate (evaluator track)",
                  responses=problem_responses(Unauthorized, NotFound))
async def candidate_scores(gw: GatewayDep, caller: AgentDep, task: str | None = TaskQuery) -> Page[CandidateScore]:
    """On the evaluator track: a development target's (``task``) score of each candidate on its validation split, to compare
    an evaluator's scores with (``null`` until graded). A sealed target's are never shown: 404 for one, as for any task
    that is not a development target."""
    return await gw.grader.candidate_scores(for_task(caller, task).ctx)


@agent_router.get("/suite/validation", tags=["suite"], summary="The visible validation items")
async def validation_items(gw: GatewayDep, caller: AgentDep, task: str | None = TaskQuery) -> Page[SuiteItemOut]:
    return await gw.grader.validation(for_task(caller, task).ctx)


# --------------------------------------------------------------------------- training


@agent_router.post("/training/jobs", status_code=201, tags=["training"], summary="Start a training job",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, NotFound, PaymentRequired,
                                               IdempotencyKeyReused))
async def create_training_job(
    req: TrainingJobCreate,
    gw: GatewayDep,
    caller: MutatingAgentDep,
    idempotency_key: str | None = Header(
        None, min_length=1, max_length=150, pattern=r"^[!-~]+$", examples=["7d1c2b4e-train-1"],
        description="Makes the call safe to repeat (e.g. after a 503 or a lost answer): the same key with the same body "
                    "returns the job first created and places no second hold; with a different body it is a 409.",
    ),
) -> TrainingJobOut:
    """Holds the job's estimated cost (402 if the budget cannot cover it), then queues it.

    Recipe fields are checked against the benchmark's allow/lock policy (403 naming ``recipe.<field>``).
    A 503 (a service restarting) is safe to retry with the same ``Idempotency-Key``.
    """
    return await gw.trainer.create_job(caller.ctx, training_job(caller, req), idempotency_key=idempotency_key)


@agent_router.get("/training/jobs", tags=["training"], summary="List training jobs")
async def list_training_jobs(gw: GatewayDep, caller: AgentDep) -> Page[TrainingJobOut]:
    return await gw.trainer.list_jobs(caller.ctx)


@agent_router.get("/training/jobs/{job_id}", tags=["training"], summary="Get a training job", responses=problem_responses(NotFound))
async def get_training_job(job_id: JobId, gw: GatewayDep, caller: AgentDep) -> TrainingJobOut:
    return await gw.trainer.get_job(caller.ctx, job_id)


@agent_router.get("/training/jobs/{job_id}/events", tags=["training"], summary="A job's events (loss, step, tokens/s)", responses=problem_responses(NotFound))
async def training_job_events(job_id: JobId, gw: GatewayDep, caller: AgentDep, after: int = Query(0, ge=0, le=2**62, description="Only events with seq > after"),
                              limit: int = Query(500, ge=1, le=5000)) -> Page[JobEventOut]:
    return await gw.trainer.job_events(caller.ctx, job_id, after=after, limit=limit)


@agent_router.get("/training/jobs/{job_id}/checkpoints", tags=["training"], summary="A job's checkpoints", responses=problem_responses(NotFound))
async def training_job_checkpoints(job_id: JobId, gw: GatewayDep, caller: AgentDep) -> Page[CheckpointOut]:
    return await gw.trainer.job_checkpoints(caller.ctx, job_id)


@agent_router.post("/training/jobs/{job_id}/cancel", tags=["training"], summary="Cancel a training job",
                   responses=problem_responses(Unauthorized, RunExpired, NotFound, Conflict))
async def cancel_training_job(job_id: JobId, gw: GatewayDep, caller: MutatingAgentDep) -> TrainingJobOut:
    """A running job stops after its current step; the tokens it processed are charged, the rest released."""
    return await gw.trainer.cancel_job(caller.ctx, job_id)


# --------------------------------------------------------------------------- OpenAI's files and fine-tuning API (gateway.finetuning)


class OpenAIRoute(StrictBodyRoute):
    """A route that answers a request it cannot validate with 400, as OpenAI's API does (its SDK raises
    ``BadRequestError``), instead of FastAPI's 422; the body is the same problem, naming the field."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as exc:
                return problem_json(validation_problem(exc, 400), 400)

        return answer


openai_router = APIRouter(prefix="/v1", responses=AGENT_ERRORS, route_class=OpenAIRoute)
FileId = Annotated[str, Path(pattern=ID_PATTERN, description="`ds_…`: a file is the run's dataset of the same id.")]
FineTuningJobId = Annotated[str, Path(pattern=ID_PATTERN, description="`job_…`")]
After = Query(None, max_length=120, description="An id of the previous page: the items after it.")
RetryCount = Header(0, alias="x-stainless-retry-count", ge=0, le=100, description="Sent by OpenAI's SDK when it repeats a request.")


@openai_router.post("/files", tags=["fine-tuning"], summary="Upload a file (OpenAI's files.create, purpose fine-tune)",
                    responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, BadRequest, Unprocessable, PayloadTooLarge))
async def create_file(gw: GatewayDep, caller: MutatingAgentDep, file: UploadFile = File(..., description="JSONL in OpenAI's or Crucible's row shapes"),
                      purpose: str = Form(..., max_length=40, examples=["fine-tune"]),
                      expires_after_anchor: str | None = Form(None, alias="expires_after[anchor]", max_length=40),
                      expires_after_seconds: str | None = Form(None, alias="expires_after[seconds]", max_length=40)) -> FileObject:
    """The same upload as ``POST /v1/datasets`` (validated on upload: 422 names the ``line`` and ``field``), answered
    as OpenAI's file object; the file's id is the dataset's (``ds_…``). Only ``purpose: fine-tune``; files are kept for
    the run's audit, so ``expires_after`` is refused."""
    if purpose != "fine-tune":
        raise BadRequest(f"purpose {purpose!r}: Crucible keeps fine-tuning files only (purpose 'fine-tune')", field="purpose")
    if expires_after_anchor is not None or expires_after_seconds is not None:
        raise BadRequest("files are kept for the run's audit; leave expires_after out", field="expires_after")
    return finetuning.file_object(await store_upload(gw, caller, file, None))


@openai_router.get("/files", tags=["fine-tuning"], summary="List files (OpenAI's files.list)")
async def list_files(gw: GatewayDep, caller: AgentDep, after: str | None = After, limit: int = Query(10_000, ge=1, le=10_000),
                     order: Literal["asc", "desc"] = "desc", purpose: Literal["fine-tune"] | None = None) -> CursorPage[FileObject]:
    return await finetuning.list_files(gw, caller, after=after, limit=limit, order=order)


@openai_router.get("/files/{file_id}", tags=["fine-tuning"], summary="Get a file (OpenAI's files.retrieve)", responses=problem_responses(NotFound))
async def get_file(file_id: FileId, gw: GatewayDep, caller: AgentDep) -> FileObject:
    return finetuning.file_object(await gw.trainer.get_dataset(caller.ctx, file_id))


@openai_router.get("/files/{file_id}/content", tags=["fine-tuning"], summary="A file's content (OpenAI's files.content)", response_class=Response,
                   responses={200: {"content": {"application/jsonl": {}}}} | problem_responses(NotFound))
async def get_file_content(file_id: FileId, gw: GatewayDep, caller: AgentDep) -> Response:
    return Response(await gw.trainer.dataset_content(caller.ctx, file_id), media_type="application/jsonl")


@openai_router.delete("/files/{file_id}", tags=["fine-tuning"], summary="Delete a file: refused (files.delete)",
                      responses=problem_responses(BadRequest, NotFound))
async def delete_file(file_id: FileId, gw: GatewayDep, caller: AgentDep) -> None:
    """A run's datasets are immutable and kept for its submissions' contamination audit: 400 for the run's own file, 404 otherwise."""
    await gw.trainer.get_dataset(caller.ctx, file_id)
    raise BadRequest("a run's files are kept for its audit and cannot be deleted", field="file_id")


@openai_router.post("/fine_tuning/jobs", tags=["fine-tuning"], summary="Create a fine-tuning job (OpenAI's fine_tuning.jobs.create)",
                    responses=problem_responses(Unauthorized, RunExpired, BadRequest, OutsideEditableSpace, PaymentRequired))
async def create_fine_tuning_job(req: FineTuningJobCreate, gw: GatewayDep, caller: MutatingAgentDep, retry_count: int = RetryCount,
                                 idempotency_key: str | None = Header(None, min_length=1, max_length=150, pattern=r"^[!-~]+$")) -> FineTuningJobOut:
    """A training job of the run (``gateway.finetuning``): ``method.type`` ``supervised`` → ``sft``, ``dpo`` → ``dpo``,
    ``reinforcement`` → ``grpo`` rewarded by its grader; its estimated cost is held (402 when the budget cannot cover
    it). A field that cannot be honoured is a 400 naming it, one the track locks a 403. The SDK's repeat of a create
    (``x-stainless-retry-count``) returns the job first created."""
    return await finetuning.create_job(gw, caller, req, retry_count=retry_count, idempotency_key=idempotency_key)


@openai_router.get("/fine_tuning/jobs", tags=["fine-tuning"], summary="List fine-tuning jobs, newest first (fine_tuning.jobs.list)")
async def list_fine_tuning_jobs(request: Request, gw: GatewayDep, caller: AgentDep, after: str | None = After,
                                limit: int = Query(20, ge=1, le=100)) -> CursorPage[FineTuningJobOut]:
    """``metadata[key]=value`` query parameters keep the jobs whose metadata holds every such pair."""
    metadata = {k[len("metadata["):-1]: v for k, v in request.query_params.items() if k.startswith("metadata[") and k.endswith("]")}
    return await finetuning.list_jobs(gw, caller, after=after, limit=limit, metadata=metadata)


@openai_router.get("/fine_tuning/jobs/{job_id}", tags=["fine-tuning"], summary="Get a fine-tuning job (fine_tuning.jobs.retrieve)",
                   responses=problem_responses(NotFound))
async def get_fine_tuning_job(job_id: FineTuningJobId, gw: GatewayDep, caller: AgentDep) -> FineTuningJobOut:
    return await finetuning.job_out(gw, caller, job_id)


@openai_router.post("/fine_tuning/jobs/{job_id}/cancel", tags=["fine-tuning"], summary="Cancel a fine-tuning job (fine_tuning.jobs.cancel)",
                    responses=problem_responses(RunExpired, BadRequest, NotFound))
async def cancel_fine_tuning_job(job_id: FineTuningJobId, gw: GatewayDep, caller: MutatingAgentDep) -> FineTuningJobOut:
    """It stops after its current step; the tokens it trained are charged, the rest of its hold released. 400 when it has ended."""
    return await finetuning.cancel_job(gw, caller, job_id)


@openai_router.post("/fine_tuning/jobs/{job_id}/pause", tags=["fine-tuning"], summary="Pause a fine-tuning job: refused (fine_tuning.jobs.pause)",
                    responses=problem_responses(BadRequest, NotFound))
async def pause_fine_tuning_job(job_id: FineTuningJobId, gw: GatewayDep, caller: MutatingAgentDep) -> FineTuningJobOut:
    """400: a job runs to its end or is cancelled; a new job continues from its latest checkpoint (``model: ckpt_…``)."""
    await finetuning.job_out(gw, caller, job_id)
    raise BadRequest("jobs cannot be paused; cancel it and continue from its latest checkpoint with a new job (model: ckpt_…)", field="fine_tuning_job_id")


@openai_router.post("/fine_tuning/jobs/{job_id}/resume", tags=["fine-tuning"], summary="Resume a fine-tuning job: refused (fine_tuning.jobs.resume)",
                    responses=problem_responses(BadRequest, NotFound))
async def resume_fine_tuning_job(job_id: FineTuningJobId, gw: GatewayDep, caller: MutatingAgentDep) -> FineTuningJobOut:
    """400, as pausing: no job is ever paused."""
    await finetuning.job_out(gw, caller, job_id)
    raise BadRequest("jobs are never paused; continue from a checkpoint with a new job (model: ckpt_…)", field="fine_tuning_job_id")


@openai_router.get("/fine_tuning/jobs/{job_id}/events", tags=["fine-tuning"], summary="A fine-tuning job's events, newest first (list_events)",
                   responses=problem_responses(NotFound))
async def list_fine_tuning_events(job_id: FineTuningJobId, gw: GatewayDep, caller: AgentDep, after: str | None = After,
                                  limit: int = Query(20, ge=1, le=1000)) -> CursorPage[FineTuningEventOut]:
    return await finetuning.list_events(gw, caller, job_id, after=after, limit=limit)


@openai_router.get("/fine_tuning/jobs/{job_id}/checkpoints", tags=["fine-tuning"], summary="A fine-tuning job's checkpoints, newest first",
                   responses=problem_responses(NotFound))
async def list_fine_tuning_checkpoints(job_id: FineTuningJobId, gw: GatewayDep, caller: AgentDep, after: str | None = After,
                                       limit: int = Query(10, ge=1, le=100)) -> CursorPage[FineTuningCheckpointOut]:
    return await finetuning.list_checkpoints(gw, caller, job_id, after=after, limit=limit)


@openai_router.post("/fine_tuning/alpha/graders/run", tags=["fine-tuning"], summary="Grade one answer with a grader (fine_tuning.alpha.graders.run)",
                    responses=problem_responses(RunExpired, BadRequest, PaymentRequired))
async def run_grader(req: GraderRunParams, gw: GatewayDep, caller: MutatingAgentDep) -> GraderRunOut:
    """What the grader gives ``model_sample`` against ``item``, as a reinforcement job's rewards are computed (the
    grader service: python graders in its sandbox, model graders through the run's metered inference)."""
    return finetuning.grader_run_out(req, (await gw.grader.run_grader(caller.ctx, GraderRunRequest(
        grader=req.grader, samples=[GraderSample(output_text=req.model_sample, item=req.item)]))).data[0])


@openai_router.post("/fine_tuning/alpha/graders/validate", tags=["fine-tuning"], summary="Check a grader (fine_tuning.alpha.graders.validate)",
                    responses=problem_responses(BadRequest))
async def validate_grader(req: GraderValidateParams, caller: AgentDep) -> GraderValidateOut:
    """The grader as it will run; 400 naming the field that is wrong (a template, a formula, a metric, python that does not compile)."""
    return GraderValidateOut(grader=req.grader.model_dump(mode="json", exclude_none=True))


# --------------------------------------------------------------------------- inference


@agent_router.get("/models", tags=["inference"], summary="List base models")
async def list_models(gw: GatewayDep, caller: AgentDep) -> Page[ModelOut]:
    """OpenAI-style model list of servable base models; checkpoints (``ckpt_…``) are served too. On the evaluator
    track: the run's candidates (``candidate-01`` …), and nothing else."""
    if evaluator.on_track(caller):
        return evaluator.models(caller)
    return await gw.inference.list_models(ctx=caller.ctx)


STREAMED = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}},
                  "description": "The answer; with `stream: true`, server-sent events (`data: {chunk}` lines) ending with `data: [DONE]`."}}


async def relay(stream: contextlib.AbstractAsyncContextManager[AsyncIterator[bytes]]) -> StreamingResponse:
    """Open an inference stream (its errors raise here, as problem+json) and relay its events as they come. A client
    that goes away closes the inference stream, which stops the generation and charges what was generated."""
    stack = contextlib.AsyncExitStack()
    chunks = await stack.enter_async_context(stream)

    async def events() -> AsyncIterator[bytes]:
        async with stack:
            async for chunk in chunks:
                yield chunk

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


@agent_router.post("/chat/completions", tags=["inference"], summary="Create a chat completion (OpenAI-compatible)",
                   responses=STREAMED | problem_responses(Unauthorized, RunExpired, Unprocessable, PaymentRequired))
async def chat_completions(req: ChatCompletionRequest, gw: GatewayDep, caller: MutatingAgentDep) -> ChatCompletion:
    """``model`` is a base model name or one of the run's ``ckpt_…``. Prompt and completion tokens are charged (the
    worst case is held first: 402 when the budget cannot cover it). Every OpenAI parameter is honoured or refused with
    a 422 naming it. ``stream: true`` answers with server-sent events; a client that disconnects pays for the tokens
    generated until then. On the evaluator track ``model`` is one of the run's candidates (``candidate-01`` …), answered by
    its system and named in the answer, never the model behind it; any other model is a 422 naming ``model``."""
    if evaluator.on_track(caller):
        if req.stream:
            return await relay(evaluator.chat_stream(gw, caller, req))  # type: ignore[return-value]
        return await evaluator.chat(gw, caller, req)
    if req.stream:
        return await relay(gw.inference.chat_completions_stream(caller.ctx, req))  # type: ignore[return-value]
    return await gw.inference.chat_completions(caller.ctx, req)


@agent_router.post("/completions", tags=["inference"], summary="Create a text completion (OpenAI-compatible, legacy)",
                   responses=STREAMED | problem_responses(Unauthorized, RunExpired, Unprocessable, PaymentRequired))
async def completions(req: CompletionRequest, gw: GatewayDep, caller: MutatingAgentDep) -> Completion:
    """The model continues ``prompt`` as given, without the chat template; ``echo`` with ``logprobs`` returns the
    prompt tokens' log-probabilities (what log-likelihood evaluation tools read). Charged as chat completions. Refused
    on the evaluator track (422 naming ``model``): its candidates are chat systems."""
    if evaluator.on_track(caller):
        evaluator.refuse_completions(req.model)
    if req.stream:
        return await relay(gw.inference.completions_stream(caller.ctx, req))  # type: ignore[return-value]
    return await gw.inference.completions(caller.ctx, req)


# --------------------------------------------------------------------------- evaluations and submissions


@agent_router.post("/evaluations", status_code=201, tags=["evaluations"], summary="Evaluate a system on the validation split",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, PaymentRequired,
                                               EvaluationRateLimited, FailedEvaluationLimit))
async def create_evaluation(req: EvaluationCreate, gw: GatewayDep, caller: MutatingAgentDep, task: str | None = TaskQuery) -> EvaluationOut:
    """Queued; poll ``GET /v1/evaluations/{id}``, then read per-item trajectories. Charged as inference tokens.

    The benchmark's limits apply (``GET /v1/run`` shows them and what is left): per hour and per day, at once
    (429 ``evaluation_limit`` with ``Retry-After``), and failed or cancelled evaluations (403
    ``failed_evaluation_limit``).
    """
    caller = for_task(caller, task)
    if req.harness is not None or req.harness_archive is not None:
        check_editable(caller, evaluator.code_part(caller), "evaluating with a custom harness")
    return await gw.grader.create_evaluation(caller.ctx, req, limits=caller.benchmark.limits.evaluation_limits())


@agent_router.get("/evaluations", tags=["evaluations"], summary="List validation evaluations")
async def list_evaluations(gw: GatewayDep, caller: AgentDep) -> Page[EvaluationOut]:
    return await gw.grader.list_evaluations(caller.ctx)


@agent_router.get("/evaluations/{eval_id}", tags=["evaluations"], summary="Get a validation evaluation", responses=problem_responses(NotFound))
async def get_evaluation(eval_id: EvalId, gw: GatewayDep, caller: AgentDep) -> EvaluationOut:
    return await gw.grader.get_evaluation(caller.ctx, eval_id)


@agent_router.get("/evaluations/{eval_id}/trajectories", tags=["evaluations"], summary="Per-item validation trajectories", responses=problem_responses(NotFound))
async def get_trajectories(eval_id: EvalId, gw: GatewayDep, caller: AgentDep) -> Page[TrajectoryOut]:
    """Prompt, completion, extracted answer and score of every validation item."""
    return await gw.grader.get_trajectories(caller.ctx, eval_id)


@agent_router.post("/submissions", status_code=201, tags=["submissions"], summary="Submit the final system for hidden-test grading",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, SubmissionLimitReached))
async def create_submission(req: SubmissionCreate, gw: GatewayDep, caller: MutatingAgentDep, task: str | None = TaskQuery) -> SubmissionOut:
    """Graded once on the task's hidden test split, not charged to the run; only the aggregate score is ever returned.
    ``final_submissions`` of the benchmark's limits is per task."""
    caller = for_task(caller, task)
    if req.harness is not None or req.harness_archive is not None:
        check_editable(caller, evaluator.code_part(caller), "submitting a custom harness")
    datasets = [DatasetDigest(id=d.id, sha256=d.sha256) for d in (await gw.trainer.list_datasets(caller.ctx)).data]  # what its audit reads
    return await gw.grader.create_submission(caller.ctx, req, max_submissions=caller.benchmark.limits.final_submissions, datasets=datasets)


@agent_router.get("/submissions", tags=["submissions"], summary="List the run's submissions")
async def list_submissions(gw: GatewayDep, caller: AgentDep) -> Page[SubmissionOut]:
    return await gw.grader.list_submissions(caller.ctx)


@agent_router.get("/submissions/{sub_id}", tags=["submissions"], summary="Get a submission", responses=problem_responses(NotFound))
async def get_submission(sub_id: SubId, gw: GatewayDep, caller: AgentDep) -> SubmissionOut:
    return await gw.grader.get_submission(caller.ctx, sub_id)


# --------------------------------------------------------------------------- leaderboard (public)


@public_router.get("/v1/leaderboard", summary="The leaderboard (JSON)")
async def leaderboard_json(gw: GatewayDep) -> Page[LeaderboardRow]:
    """One row per run: per task its latest graded final submission (a later one still grading or failed leaves the row as it
    was), initial and final hidden-test scores, gap closed, validation evaluations, spend, hours. On the evaluator track the
    figures derived from the sealed targets beyond the grade itself wait until no run of the benchmark is open
    (``sealed_withheld``; the operator's ``GET /admin/leaderboard`` has them)."""
    return Page[LeaderboardRow](data=await leaderboard.leaderboard(gw))


@public_router.get("/leaderboard", summary="The leaderboard (HTML)", response_class=HTMLResponse)
async def leaderboard_html(request: Request, gw: GatewayDep) -> HTMLResponse:
    """What ``/v1/leaderboard`` answers, a table and a plot of final score against spend per benchmark (``gateway.pages``)."""
    return await pages.leaderboard_page(request, gw)


# --------------------------------------------------------------------------- a run's page (HTML; its own key or the admin key)


@public_router.get("/runs/{run_id}", tags=["pages"], summary="A run's page (HTML): its own key or the admin key", response_class=HTMLResponse,
                   responses=problem_responses(Unauthorized, NotFound, TooManyRequests, UpstreamUnavailable))
async def run_page(request: Request, run_id: RunId, gw: GatewayDep,
                   authorization: str | None = Header(None, description="`Bearer <run API key or admin key>`; a browser signs in instead"),
                   crucible_key: str | None = Cookie(None, description="The session token `POST /runs/login` set (not the key).")) -> HTMLResponse:
    """The run's report as a page: validation score over time, spend against the budget, time by activity, designs
    tried, its submissions' aggregate scores. Never public.

    Authorized by the run's own key or the admin key, as ``Authorization: Bearer <key>``, or from a browser (which
    cannot send a header with a link) by the ``crucible_key`` cookie its sign-in form (``POST /runs/login``, the key in
    the form body, never in the URL) set: a token signed by the gateway, not the key, valid an hour, ``HttpOnly``,
    ``SameSite=Strict``, ``Path=/runs`` (``gateway.pages`` states the design). 401 without a valid credential: the
    sign-in form (HTML) to a browser, problem+json otherwise; 404 with another run's key, as the API answers for
    another run's objects."""
    try:
        caller, viewer = await run_in_threadpool(pages.page_caller, gw, run_id, authorization, crucible_key)
    except Unauthorized as exc:
        if authorization is None and pages.wants_html(request):
            return pages.login_page(request, run_id, exc.detail if crucible_key else "Sign in to see this run.")
        raise
    if not viewer.admin:
        await gw.limiter.check(caller.run.key_hash)  # the run key's rate limits, as its API calls
    return await pages.run_page(request, gw, caller)


@public_router.post("/runs/login", tags=["pages"], summary="Sign in to a run's page (HTML form)", response_class=HTMLResponse, status_code=303,
                    responses=problem_responses(Unauthorized, Forbidden, NotFound, Unprocessable, TooManyRequests))
async def run_page_login(request: Request, gw: GatewayDep, run_id: Annotated[str, Form(pattern=ID_PATTERN, description="`run_…`")],
                         key: Annotated[str, Form(min_length=1, max_length=512, description="The run's API key or the admin key.")],
                         sec_fetch_site: str | None = Header(None, include_in_schema=False)) -> Response:
    """The run page's sign-in form posts here: with the run's key (or the admin key) it answers 303 to ``/runs/{run_id}``
    with the ``crucible_key`` session cookie (a signed token, not the key; an hour); with a wrong key, the form again
    (401); with another run's key, 404. A form posted from another site (``Sec-Fetch-Site``, or an ``Origin`` that is
    not this host) is refused (403); sign-ins count against the caller's address's rate limits (429)."""
    pages.check_same_site(request, sec_fetch_site)
    await gw.limiter.check(f"login:{request.client.host if request.client else '-'}")
    try:
        token = await run_in_threadpool(pages.sign_in, gw, run_id, key)
    except Unauthorized as exc:
        return pages.login_page(request, run_id, f"{exc.detail}: check the key and sign in again.")
    return pages.signed_in(request, run_id, token)


# --------------------------------------------------------------------------- operators


@admin_router.post("/benchmarks", status_code=201, summary="Load a benchmark", responses=problem_responses(Unprocessable, Conflict, UpstreamUnavailable))
async def load_benchmark(doc: dict[str, Any], gw: GatewayDep) -> BenchmarkOut:
    """The benchmark file's content as JSON (the CLI reads the YAML). Answers in seconds with ``status`` ``building``: the
    grader builds the tasks' splits in the background (``GET /admin/benchmarks/{id}`` follows it to ``ready`` or
    ``failed``), then grades the baselines. Idempotent: the same name and document again, also after a timeout or
    beside a concurrent call, is the same benchmark (no second split, no second grading). 422 names the offending key;
    409 (``name``) for another document under a name whose benchmark did not fail."""
    return await benchmarks.load_benchmark(gw, doc)


@admin_router.get("/leaderboard", summary="The leaderboard with every sealed figure (JSON)")
async def admin_leaderboard(gw: GatewayDep) -> Page[LeaderboardRow]:
    """What ``/v1/leaderboard`` answers, with the evaluator track's figures derived from the sealed targets' scores (Kendall's
    tau, concordance, ceiling, per-target rows) also while runs of the benchmark are open (``gateway.leaderboard``)."""
    return Page[LeaderboardRow](data=await leaderboard.leaderboard(gw, operator=True))


@admin_router.get("/benchmarks", summary="List benchmarks with their status")
async def list_benchmarks(gw: GatewayDep) -> Page[BenchmarkOut]:
    return Page[BenchmarkOut](data=await benchmarks.list_benchmarks(gw))


@admin_router.get("/benchmarks/{benchmark_id}", summary="A benchmark and its status", responses=problem_responses(NotFound))
async def benchmark_info(benchmark_id: Annotated[str, Path(max_length=200)], gw: GatewayDep) -> BenchmarkOut:
    """By id or name: its file, and ``status`` (``building`` → ``ready`` or ``failed``, with ``error``)."""
    return await benchmarks.benchmark_info(gw, benchmark_id)


@admin_router.get("/benchmarks/{benchmark_id}/baselines", summary="A benchmark's baseline test scores", responses=problem_responses(NotFound))
async def benchmark_baselines(benchmark_id: Annotated[str, Path(max_length=200)], gw: GatewayDep) -> BenchmarkBaselines:
    """Per task, the grader's view: split sizes, the initial (and reference) system's hidden-test score and status."""
    return await benchmarks.benchmark_baselines(gw, benchmark_id)


@admin_router.post("/models", status_code=201, summary="Register a base model", responses=problem_responses(Unprocessable, Conflict))
async def register_model(doc: Annotated[dict[str, Any], Body(openapi_examples={"gemma": {"value": ModelCard.model_json_schema()["example"]}})],
                         gw: GatewayDep) -> ModelCard:
    """A model card (``services.common.llms.ModelCard``; the CLI reads it from YAML): inference prepares the weights into the
    models folder (once; minutes for a large GGUF) and serves the model at once, no restart; benchmarks and training jobs
    may name it from then on. 422 names the card's field (``source.path``); 409 (``name``) when the name is registered
    from another source, chat template or stop tokens; the same card again changes nothing."""
    try:
        card = parse_card(doc)
    except ModelPreparationError as exc:
        raise Unprocessable(str(exc), field=exc.field) from exc
    return await gw.inference.register_base_model(card)


@admin_router.post("/task-collections", status_code=201, summary="Import tasks (an operator's own, for a hidden test split)",
                   responses=problem_responses(Unprocessable, Conflict, PayloadTooLarge))
async def import_tasks(gw: GatewayDep,
                       file: UploadFile = File(..., description="A .tar.gz of one folder: Harbor task folders (terminal) or instances.jsonl "
                                                                "with repos/ (swe); docs/operators.md states the format"),
                       name: str = Form(..., pattern=COLLECTION_NAME, description="The collection's name (1-63 of a-z 0-9 . _ -)."),
                       suite: str = Form(..., pattern="^(terminal|swe)$", description="terminal or swe")) -> TaskCollectionOut:
    """Stored in the grader's test store (the tasks never leave the grader) and validated on an eval worker: a task is
    accepted when its oracle resolves it in the sandbox and doing nothing does not; ``GET /admin/task-collections/{name}``
    follows the validation and tells why each refused task was refused. A benchmark draws its test split from the
    accepted tasks with ``suite.splits.test.collection``. 409 (``name``) if the collection exists; 413 past
    ``max_upload_bytes``; 422 names the field."""
    limit = gw.settings.max_upload_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"the file is larger than {limit} bytes", field="file")
    return await gw.grader.import_tasks(name, suite, data)


@admin_router.get("/task-collections", summary="List the imported task collections")
async def task_collections(gw: GatewayDep) -> Page[TaskCollectionOut]:
    return await gw.grader.task_collections()


@admin_router.get("/task-collections/{name}", summary="An imported task collection and each task's validation", responses=problem_responses(NotFound))
async def task_collection(name: Annotated[str, Path(pattern=COLLECTION_NAME)], gw: GatewayDep) -> TaskCollectionOut:
    """Its status (``validating`` until every task is accepted or refused), counts, and per task its status and the
    reason of a refusal."""
    return await gw.grader.task_collection(name)


@admin_router.get("/models", summary="List the served base models")
async def list_models_cards(gw: GatewayDep) -> Page[ModelCard]:
    """The cards of the base models inference serves now."""
    return await gw.inference.list_base_models()


@admin_router.post("/runs", status_code=201, summary="Create a run and its API key", responses=problem_responses(NotFound, BenchmarkNotReady))
async def create_run(req: RunCreate, gw: GatewayDep) -> RunCreated:
    """The ``api_key`` is in this answer only; it is stored as a hash. 409 ``benchmark_not_ready`` while the benchmark's
    splits are being built (with ``retry_after_s``) or when their build failed."""
    return await runs.create_run(gw, req)


@admin_router.get("/runs", summary="List runs")
def list_runs(gw: GatewayDep) -> Page[RunOut]:
    return Page[RunOut](data=runs.list_runs(gw))


@admin_router.post("/runs/{run_id}/revoke", summary="Revoke a run's key", responses=problem_responses(NotFound))
def revoke(run_id: RunId, gw: GatewayDep) -> RunOut:
    return runs.revoke_run_key(gw, run_id)


@admin_router.get("/runs/{run_id}/episode", summary="A run's episode log (every agent call)")
def episode(run_id: RunId, gw: GatewayDep, after: int = Query(0, ge=0, le=2**62), limit: int = Query(1000, ge=1, le=10_000)) -> dict:
    return {"object": "list", "data": episode_log(gw, run_id, after, limit)}


@admin_router.get("/runs/{run_id}/report", summary="A run's report", responses=problem_responses(NotFound))
async def run_report(run_id: RunId, gw: GatewayDep) -> RunReport:
    """What ``GET /v1/run/report`` answers the run's agent, for the operator."""
    return await reports.run_report(gw, await run_in_threadpool(run_caller, gw, run_id))


@admin_router.get("/audit", summary="The audit log (operator actions and refused credentials)")
def audit(gw: GatewayDep, after: int = Query(0, ge=0, le=2**62), limit: int = Query(1000, ge=1, le=10_000)) -> dict:
    """Append-only: ``{seq, actor (admin|anonymous), key_prefix, method, path, status, client, created_at}``, oldest first."""
    return {"object": "list", "data": audit_log(gw, after, limit)}


@admin_router.get("/runs/{run_id}/entries", summary="A run's ledger entries", responses=problem_responses(NotFound))
async def entries(run_id: RunId, gw: GatewayDep, after: str | None = Query(None, description="Entries appended after this entry id."),
                  limit: int = Query(1000, ge=1, le=10_000)) -> Page[Entry]:
    """The run's append-only ledger entries in order."""
    return Page[Entry](data=await runs.ledger_entries(gw, run_id, after, limit))


@admin_router.post("/runs/{run_id}/refunds", status_code=201, summary="Refund a charge to a run",
                   responses=problem_responses(NotFound, Conflict, Unprocessable))
async def refund(run_id: RunId, req: RefundRequest, gw: GatewayDep) -> Refund:
    """Give back (part of) one of the run's charges, e.g. work lost to a platform fault: a ``refund`` entry in the
    ledger (append-only; the charge stays) that lowers the run's spent total. ``amount_usd_micros`` omitted:
    everything of the charge not refunded yet. Repeating ``idempotency_key`` returns the first answer."""
    return await runs.refund(gw, run_id, req)


@admin_router.get("/accounts", summary="Every ledger account")
async def accounts(gw: GatewayDep) -> list[Balance]:
    return await gw.ledger.list_balances()
