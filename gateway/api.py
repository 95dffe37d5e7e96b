"""Gateway routes: the agent API (``/v1``, run key), operator admin (``/admin``, admin key), public leaderboard.

Routes parse, authorize, call ``service`` or forward to the owning service, and return its schema.
Errors are raised, never formatted here; every route documents the problems it can answer with.
"""

from __future__ import annotations

import hmac
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Header, Path, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse

from gateway import service
from gateway.schemas import BenchmarkOut, BudgetOut, LeaderboardRow, RefundRequest, RunCard, RunCreate, RunCreated, RunOut
from gateway.service import Caller
from services.common.auth import hash_secret
from services.common.contracts import (
    ChatCompletion,
    ChatCompletionRequest,
    CheckpointOut,
    DatasetOut,
    EvaluationCreate,
    EvaluationOut,
    JobEventOut,
    Page,
    Recipe,
    SubmissionCreate,
    SubmissionOut,
    SuiteItemOut,
    TrainingJobCreate,
    TrainingJobOut,
    TrajectoryOut,
)
from services.common.errors import (
    Conflict,
    EvaluationRateLimited,
    FailedEvaluationLimit,
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

# --------------------------------------------------------------------------- dependencies


async def agent(request: Request, authorization: str | None = Header(None, description="`Bearer <run API key>`")) -> Caller:
    """The calling run (401 if the key is missing, unknown or revoked); marks the call for the episode log.

    429 past the key's rate limits, counted as the request arrives, before it waits for a thread or the database."""
    key = service.bearer_key(authorization)
    if key:
        await service.runtime().limiter.check(hash_secret(key))
    caller = await run_in_threadpool(service.authenticate, authorization)
    request.state.run_id = caller.run.id
    return caller


async def mutating_agent(caller: Caller = Depends(agent)) -> Caller:
    """The calling run, for calls that change state: refused with 403 ``run_expired`` past the deadline."""
    service.check_deadline(caller)
    return caller


def admin(authorization: str | None = Header(None, description="`Bearer <admin key>`")) -> None:
    """Operator authorization with the admin key (never a run key)."""
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(key.encode(), service.runtime().settings.admin_key.encode()):
        raise Unauthorized("admin routes need the operator's admin key")


def episode_middleware(app: Any) -> None:
    """Record every agent call (run, method, path, status, latency in ms) in the episode log, and every
    operator call and every refused credential (401) in the audit log."""

    @app.middleware("http")
    async def _episode(request: Request, call_next):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        response = await call_next(request)
        run_id = getattr(request.state, "run_id", None)
        path = request.url.path
        if run_id:
            await run_in_threadpool(service.log_call, run_id, request.method, path, response.status_code, int((time.perf_counter() - start) * 1000))
        elif path.startswith("/admin") or response.status_code == 401:
            _scheme, _, key = request.headers.get("authorization", "").partition(" ")
            actor = "admin" if path.startswith("/admin") and response.status_code != 401 else "anonymous"
            prefix = (key.strip()[:8] or None) if actor == "anonymous" else None  # never the whole key
            await run_in_threadpool(service.log_audit, actor, prefix, request.method, path, response.status_code,
                                    request.client.host if request.client else None)
        return response


ID_PATTERN = r"^[a-z]{2,4}_[0-9a-z]{26}$"
DatasetId = Annotated[str, Path(pattern=ID_PATTERN, description="`ds_…`")]
JobId = Annotated[str, Path(pattern=ID_PATTERN, description="`job_…`")]
EvalId = Annotated[str, Path(pattern=ID_PATTERN, description="`eval_…`")]
SubId = Annotated[str, Path(pattern=ID_PATTERN, description="`sub_…`")]
RunId = Annotated[str, Path(pattern=ID_PATTERN, description="`run_…`")]

AGENT_ERRORS = problem_responses(Unauthorized, TooManyRequests, UpstreamUnavailable)  # 503: a service is restarting; retry
MUTATING_ERRORS = problem_responses(Unauthorized, RunExpired, PaymentRequired)
agent_router = APIRouter(prefix="/v1", responses=AGENT_ERRORS)
TaskQuery = Query(None, min_length=1, max_length=64, examples=["math"],
                  description="The benchmark's task (see `GET /v1/run`); may be left out when the benchmark has one task.")
admin_router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[Depends(admin)], responses=problem_responses(Unauthorized))
public_router = APIRouter(tags=["leaderboard"])

# --------------------------------------------------------------------------- run


@agent_router.get("/run", tags=["run"], summary="The run card")
async def get_run(caller: Caller = Depends(agent)) -> RunCard:
    """Benchmark card, track and editable space, recipe policy, evaluation settings, deadline, budget, limits."""
    return await service.run_card(caller)


@agent_router.get("/budget", tags=["run"], summary="Budget remaining and spent by kind")
async def get_budget(caller: Caller = Depends(agent)) -> BudgetOut:
    """Micro-USD: ``budget = remaining + held + spent``; ``spent_by_kind`` per usage kind. Works after exhaustion."""
    return await service.budget(caller)


# --------------------------------------------------------------------------- datasets and suite data


@agent_router.post("/datasets", status_code=201, tags=["datasets"], summary="Upload a JSONL dataset",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, PayloadTooLarge))
async def upload_dataset(file: UploadFile = File(..., description="JSONL: chat `messages`, or `prompt`/`completion`, or `prompt`/`chosen`/`rejected`"),
                         name: str | None = Form(None, max_length=200), caller: Caller = Depends(mutating_agent)) -> DatasetOut:
    """Validated on upload (422 names the ``line`` and ``field``), content-addressed and immutable."""
    service.check_editable(caller, "data", "uploading a dataset")
    limit = service.runtime().settings.max_upload_bytes
    data = await file.read(limit + 1)
    if len(data) > limit:
        raise PayloadTooLarge(f"the file is larger than {limit} bytes", field="file")
    out = await service.runtime().trainer.post("/internal/datasets", ctx=caller.ctx, content=data,
                                               params={"name": name or file.filename or "dataset.jsonl"}, headers={"Content-Type": "application/jsonl"})
    return DatasetOut(**out)


@agent_router.get("/datasets", tags=["datasets"], summary="List the run's datasets")
async def list_datasets(caller: Caller = Depends(agent)) -> Page[DatasetOut]:
    return Page[DatasetOut](**await service.runtime().trainer.get("/internal/datasets", ctx=caller.ctx))


@agent_router.get("/datasets/{dataset_id}", tags=["datasets"], summary="Get a dataset", responses=problem_responses(NotFound))
async def get_dataset(dataset_id: DatasetId, caller: Caller = Depends(agent)) -> DatasetOut:
    return DatasetOut(**await service.runtime().trainer.get(f"/internal/datasets/{dataset_id}", ctx=caller.ctx))


@agent_router.get("/suite/train-sample", tags=["suite"], summary="Items of the suite's training pool")
async def train_sample(offset: int = Query(0, ge=0, le=2**31), limit: int = Query(100, ge=1, le=10_000), task: str | None = TaskQuery,
                       caller: Caller = Depends(agent)) -> Page[SuiteItemOut]:
    """Question/answer pairs of the task's public training pool, drawn from its train seed without the validation
    items; a function of the benchmark file alone (the hidden test split is drawn around it, never the reverse)."""
    caller = service.for_task(caller, task)
    return Page[SuiteItemOut](**await service.runtime().grader.get("/internal/suite/train-sample", ctx=caller.ctx, params={"offset": offset, "limit": limit}))


@agent_router.get("/suite/validation", tags=["suite"], summary="The visible validation items")
async def validation_items(task: str | None = TaskQuery, caller: Caller = Depends(agent)) -> Page[SuiteItemOut]:
    caller = service.for_task(caller, task)
    return Page[SuiteItemOut](**await service.runtime().grader.get("/internal/suite/validation", ctx=caller.ctx))


# --------------------------------------------------------------------------- training


@agent_router.post("/training/jobs", status_code=201, tags=["training"], summary="Start a training job",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, NotFound, PaymentRequired,
                                               IdempotencyKeyReused))
async def create_training_job(
    req: TrainingJobCreate,
    caller: Caller = Depends(mutating_agent),
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
    if "data" not in caller.ctx.editable and "trainer" not in caller.ctx.editable:
        service.check_editable(caller, "trainer", "starting a training job")
    recipe = Recipe(**service.apply_recipe_policy(caller, req.recipe.model_dump(exclude_unset=True)))
    body = req.model_copy(update={"recipe": recipe}).model_dump(mode="json")
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    return TrainingJobOut(**await service.runtime().trainer.post("/internal/jobs", ctx=caller.ctx, json=body, headers=headers))


@agent_router.get("/training/jobs", tags=["training"], summary="List training jobs")
async def list_training_jobs(caller: Caller = Depends(agent)) -> Page[TrainingJobOut]:
    return Page[TrainingJobOut](**await service.runtime().trainer.get("/internal/jobs", ctx=caller.ctx))


@agent_router.get("/training/jobs/{job_id}", tags=["training"], summary="Get a training job", responses=problem_responses(NotFound))
async def get_training_job(job_id: JobId, caller: Caller = Depends(agent)) -> TrainingJobOut:
    return TrainingJobOut(**await service.runtime().trainer.get(f"/internal/jobs/{job_id}", ctx=caller.ctx))


@agent_router.get("/training/jobs/{job_id}/events", tags=["training"], summary="A job's events (loss, step, tokens/s)", responses=problem_responses(NotFound))
async def training_job_events(job_id: JobId, after: int = Query(0, ge=0, le=2**62, description="Only events with seq > after"), limit: int = Query(500, ge=1, le=5000),
                              caller: Caller = Depends(agent)) -> Page[JobEventOut]:
    return Page[JobEventOut](**await service.runtime().trainer.get(f"/internal/jobs/{job_id}/events", ctx=caller.ctx, params={"after": after, "limit": limit}))


@agent_router.get("/training/jobs/{job_id}/checkpoints", tags=["training"], summary="A job's checkpoints", responses=problem_responses(NotFound))
async def training_job_checkpoints(job_id: JobId, caller: Caller = Depends(agent)) -> Page[CheckpointOut]:
    return Page[CheckpointOut](**await service.runtime().trainer.get(f"/internal/jobs/{job_id}/checkpoints", ctx=caller.ctx))


@agent_router.post("/training/jobs/{job_id}/cancel", tags=["training"], summary="Cancel a training job",
                   responses=problem_responses(Unauthorized, RunExpired, NotFound, Conflict))
async def cancel_training_job(job_id: JobId, caller: Caller = Depends(mutating_agent)) -> TrainingJobOut:
    """A running job stops after its current step; the tokens it processed are charged, the rest released."""
    return TrainingJobOut(**await service.runtime().trainer.post(f"/internal/jobs/{job_id}/cancel", ctx=caller.ctx))


# --------------------------------------------------------------------------- inference


@agent_router.get("/models", tags=["inference"], summary="List base models")
async def list_models(caller: Caller = Depends(agent)) -> dict:
    """OpenAI-style model list of servable base models; checkpoints (``ckpt_…``) are served too."""
    return await service.runtime().inference.get("/internal/models", ctx=caller.ctx)


@agent_router.post("/chat/completions", tags=["inference"], summary="Create a chat completion (OpenAI-compatible)",
                   responses=problem_responses(Unauthorized, RunExpired, Unprocessable, PaymentRequired))
async def chat_completions(req: ChatCompletionRequest, caller: Caller = Depends(mutating_agent)) -> ChatCompletion:
    """``model`` is a base model name or one of the run's ``ckpt_…``. Prompt and completion tokens are charged."""
    return ChatCompletion(**await service.runtime().inference.post("/internal/chat/completions", ctx=caller.ctx, json=req.model_dump(mode="json", exclude_none=True)))


# --------------------------------------------------------------------------- evaluations and submissions


@agent_router.post("/evaluations", status_code=201, tags=["evaluations"], summary="Evaluate a system on the validation split",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, PaymentRequired,
                                               EvaluationRateLimited, FailedEvaluationLimit))
async def create_evaluation(req: EvaluationCreate, task: str | None = TaskQuery, caller: Caller = Depends(mutating_agent)) -> EvaluationOut:
    """Queued; poll ``GET /v1/evaluations/{id}``, then read per-item trajectories. Charged as inference tokens.

    The benchmark's limits apply (``GET /v1/run`` shows them and what is left): per hour and per day, at once
    (429 ``evaluation_limit`` with ``Retry-After``), and failed or cancelled evaluations (403
    ``failed_evaluation_limit``).
    """
    caller = service.for_task(caller, task)
    if req.harness is not None:
        service.check_editable(caller, "harness", "evaluating with a custom harness")
    limits = caller.benchmark.limits.evaluation_limits().model_dump(exclude_none=True)
    return EvaluationOut(**await service.runtime().grader.post("/internal/evaluations", ctx=caller.ctx, json=req.model_dump(mode="json"), params=limits))


@agent_router.get("/evaluations", tags=["evaluations"], summary="List validation evaluations")
async def list_evaluations(caller: Caller = Depends(agent)) -> Page[EvaluationOut]:
    return Page[EvaluationOut](**await service.runtime().grader.get("/internal/evaluations", ctx=caller.ctx))


@agent_router.get("/evaluations/{eval_id}", tags=["evaluations"], summary="Get a validation evaluation", responses=problem_responses(NotFound))
async def get_evaluation(eval_id: EvalId, caller: Caller = Depends(agent)) -> EvaluationOut:
    return EvaluationOut(**await service.runtime().grader.get(f"/internal/evaluations/{eval_id}", ctx=caller.ctx))


@agent_router.get("/evaluations/{eval_id}/trajectories", tags=["evaluations"], summary="Per-item validation trajectories", responses=problem_responses(NotFound))
async def get_trajectories(eval_id: EvalId, caller: Caller = Depends(agent)) -> Page[TrajectoryOut]:
    """Prompt, completion, extracted answer and score of every validation item."""
    return Page[TrajectoryOut](**await service.runtime().grader.get(f"/internal/evaluations/{eval_id}/trajectories", ctx=caller.ctx))


@agent_router.post("/submissions", status_code=201, tags=["submissions"], summary="Submit the final system for hidden-test grading",
                   responses=problem_responses(Unauthorized, RunExpired, OutsideEditableSpace, Unprocessable, SubmissionLimitReached))
async def create_submission(req: SubmissionCreate, task: str | None = TaskQuery, caller: Caller = Depends(mutating_agent)) -> SubmissionOut:
    """Graded once on the task's hidden test split, not charged to the run; only the aggregate score is ever returned.
    ``final_submissions`` of the benchmark's limits is per task."""
    caller = service.for_task(caller, task)
    if req.harness is not None:
        service.check_editable(caller, "harness", "submitting a custom harness")
    return SubmissionOut(**await service.runtime().grader.post("/internal/submissions", ctx=caller.ctx, json=req.model_dump(mode="json"),
                                                               params={"max_submissions": caller.benchmark.limits.final_submissions}))


@agent_router.get("/submissions", tags=["submissions"], summary="List the run's submissions")
async def list_submissions(caller: Caller = Depends(agent)) -> Page[SubmissionOut]:
    return Page[SubmissionOut](**await service.runtime().grader.get("/internal/submissions", ctx=caller.ctx))


@agent_router.get("/submissions/{sub_id}", tags=["submissions"], summary="Get a submission", responses=problem_responses(NotFound))
async def get_submission(sub_id: SubId, caller: Caller = Depends(agent)) -> SubmissionOut:
    return SubmissionOut(**await service.runtime().grader.get(f"/internal/submissions/{sub_id}", ctx=caller.ctx))


# --------------------------------------------------------------------------- leaderboard (public)


@public_router.get("/v1/leaderboard", summary="The leaderboard (JSON)")
async def leaderboard_json() -> Page[LeaderboardRow]:
    """One row per run: per task its latest graded final submission (a later one still grading or failed leaves the row as it
    was), initial and final hidden-test scores, gap closed, validation evaluations, spend, hours."""
    return Page[LeaderboardRow](data=await service.leaderboard())


@public_router.get("/leaderboard", summary="The leaderboard (HTML)", response_class=HTMLResponse)
async def leaderboard_html(request: Request) -> HTMLResponse:
    from gateway.app import templates

    return templates.TemplateResponse(request, "leaderboard.html", {"rows": await service.leaderboard()})


# --------------------------------------------------------------------------- operators


@admin_router.post("/benchmarks", status_code=201, summary="Load a benchmark", responses=problem_responses(Unprocessable, Conflict))
async def load_benchmark(doc: dict[str, Any]) -> BenchmarkOut:
    """The benchmark file's content as JSON (the CLI reads the YAML). 422 names the offending key."""
    return await service.load_benchmark(doc)


@admin_router.get("/benchmarks", summary="List benchmarks")
def list_benchmarks() -> Page[BenchmarkOut]:
    return Page[BenchmarkOut](data=service.list_benchmarks())


@admin_router.get("/benchmarks/{benchmark_id}/baselines", summary="A benchmark's baseline test scores", responses=problem_responses(NotFound))
async def benchmark_baselines(benchmark_id: str) -> dict[str, Any]:
    """The grader's view: split sizes, the initial (and reference) system's hidden-test score and status."""
    return await service.benchmark_baselines(benchmark_id)


@admin_router.post("/runs", status_code=201, summary="Create a run and its API key", responses=problem_responses(NotFound))
async def create_run(req: RunCreate) -> RunCreated:
    """The ``api_key`` is in this answer only; it is stored as a hash."""
    return await service.create_run(req)


@admin_router.get("/runs", summary="List runs")
def list_runs() -> Page[RunOut]:
    return Page[RunOut](data=service.list_runs())


@admin_router.post("/runs/{run_id}/revoke", summary="Revoke a run's key", responses=problem_responses(NotFound))
def revoke(run_id: RunId) -> RunOut:
    return service.revoke_run_key(run_id)


@admin_router.get("/runs/{run_id}/episode", summary="A run's episode log (every agent call)")
def episode(run_id: RunId, after: int = Query(0, ge=0, le=2**62), limit: int = Query(1000, ge=1, le=10_000)) -> dict:
    return {"object": "list", "data": service.episode_log(run_id, after, limit)}


@admin_router.get("/audit", summary="The audit log (operator actions and refused credentials)")
def audit(after: int = Query(0, ge=0, le=2**62), limit: int = Query(1000, ge=1, le=10_000)) -> dict:
    """Append-only: ``{seq, actor (admin|anonymous), key_prefix, method, path, status, client, created_at}``, oldest first."""
    return {"object": "list", "data": service.audit_log(after, limit)}


@admin_router.get("/runs/{run_id}/entries", summary="A run's ledger entries", responses=problem_responses(NotFound))
async def entries(run_id: RunId, after: str | None = Query(None, description="Entries appended after this entry id."),
                  limit: int = Query(1000, ge=1, le=10_000)) -> dict:
    """The run's append-only ledger entries in order: ``{id, type (grant|hold|release|charge|refund), amount_usd_micros,
    kind, quantity, model, hold_id, purpose, price_version, idempotency_key, refund_of, created_at}``."""
    return {"object": "list", "data": await service.ledger_entries(run_id, after, limit)}


@admin_router.post("/runs/{run_id}/refunds", status_code=201, summary="Refund a charge to a run",
                   responses=problem_responses(NotFound, Conflict, Unprocessable))
async def refund(run_id: RunId, req: RefundRequest) -> dict:
    """Give back (part of) one of the run's charges, e.g. work lost to a platform fault: a ``refund`` entry in the
    ledger (append-only; the charge stays) that lowers the run's spent total. ``amount_usd_micros`` omitted:
    everything of the charge not refunded yet. Repeating ``idempotency_key`` returns the first answer.
    Answers ``{entry_id, account_id, refund_of, amount_usd_micros, reason, remaining_usd_micros, created_at}``."""
    return await service.refund(run_id, req)


@admin_router.get("/accounts", summary="Every ledger account")
async def accounts() -> Any:
    return await service.runtime().ledger.get("/internal/accounts")
