"""OpenAI's files and fine-tuning API over Crucible's own nouns, so the unmodified ``openai`` SDK trains on the platform.

- A **file** (``files.create(purpose="fine-tune")``) is the run's dataset of the same id (``ds_…``): the same upload,
  validation (OpenAI's row shapes included: ``trainer_service.schemas``) and immutability.
- A **fine-tuning job** is the trainer's training job of the same id (``job_…``), created under the same run key, budget
  hold, track and recipe allow/lock as ``POST /v1/training/jobs``. ``method.type`` maps onto ``recipe.method``
  (:data:`METHODS`), the hyper-parameters onto recipe fields (:func:`job_request`); ``"auto"`` (or leaving one out)
  takes the benchmark's recipe, its default or the value its track locks. A field that cannot be honoured is refused,
  400 naming it in OpenAI's terms (``method.dpo.hyperparameters.beta``), and a field the track locks is a 403 naming it.
- The job's **fine-tuned model** is its last checkpoint's id and each **checkpoint** is its own model name: both are
  usable as ``model`` in chat completions, evaluations and submissions as they are.
- What OpenAI's job object says that the trainer's job does not hold (the method as sent, the values its ``"auto"``
  resolved to, ``suffix``, ``metadata``) is kept in the gateway's ``fine_tuning_jobs`` table.

OpenAI's SDK sends no idempotency key; it repeats a create after a timeout or a 5xx with
``x-stainless-retry-count`` ≥ 1. Such a repeat of the run's create of the same body within
:data:`RETRY_WINDOW` returns the job first created instead of a second one. An ``Idempotency-Key`` header, where a
client sends one, is passed to the trainer as for ``POST /v1/training/jobs``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from typing import Any

from starlette.concurrency import run_in_threadpool

from gateway import repository
from gateway.models import FineTuningJob
from gateway.schemas import (
    CursorPage,
    FileObject,
    FineTuningCheckpointOut,
    FineTuningEventOut,
    FineTuningJobCreate,
    FineTuningJobError,
    FineTuningJobOut,
    FineTuningMethod,
    GraderRunOut,
    GraderRunParams,
)
from gateway.service import Caller, Gateway, recipe_field_free, training_job
from services.common.contracts import CheckpointOut, DatasetOut, JobEventOut, Recipe, TrainingJobCreate, TrainingJobOut
from services.common.db import utcnow
from services.common.errors import BadRequest, NotFound, OutsideEditableSpace, UpstreamProblem
from services.common.graders import GraderResult

METHODS = {"supervised": "sft", "dpo": "dpo", "reinforcement": "grpo"}
"""OpenAI's ``method.type`` → Crucible's ``recipe.method``."""

GROUP_PER_COMPUTE = 4
"""``recipe.grpo_group_size`` = round(this × ``compute_multiplier``): 1.0 is GRPO's default group of 4."""

RETRY_WINDOW = dt.timedelta(minutes=10)
"""How long a repeated create (``x-stainless-retry-count`` ≥ 1) of the same body finds the job first created."""

STATUS = {"validating": "validating_files", "queued": "queued", "running": "running", "paused": "paused", "succeeded": "succeeded",
          "failed": "failed", "cancelled": "cancelled"}
"""The trainer's job status → OpenAI's."""

_DEFAULTS = Recipe()


def _unix(t: dt.datetime | None) -> int | None:
    return None if t is None else int(t.timestamp())


def file_object(d: DatasetOut) -> FileObject:
    """A dataset as OpenAI's file object."""
    return FileObject(id=d.id, bytes=d.bytes, created_at=int(d.created_at.timestamp()), filename=d.name)


def _param(method: str, field: str) -> str:
    """The OpenAI parameter a recipe field comes from (for a 403 of the track's policy)."""
    hyper = f"method.{method}.hyperparameters"
    return {"method": "method.type", "batch_size": f"{hyper}.batch_size", "learning_rate": f"{hyper}.learning_rate_multiplier",
            "max_steps": f"{hyper}.n_epochs", "dpo_beta": f"{hyper}.beta", "grpo_group_size": f"{hyper}.compute_multiplier",
            "seed": "seed"}.get(field, f"recipe.{field}")


def request_sha256(req: FineTuningJobCreate) -> str:
    """The hash of a create's body (its fields as sent), which recognizes the SDK's repeat of it."""
    return hashlib.sha256(req.model_dump_json(exclude_unset=True).encode()).hexdigest()


def job_request(caller: Caller, req: FineTuningJobCreate, rows: int) -> TrainingJobCreate:
    """The training job a create asks for, on a training file of ``rows`` rows, under the benchmark's recipe policy.

    Each hyper-parameter that is set (not ``"auto"``) becomes its recipe field: ``batch_size``; ``learning_rate`` =
    ``learning_rate_multiplier`` × the recipe's default learning rate; ``max_steps`` = ⌈``n_epochs`` × ``rows`` /
    ``batch_size``⌉; DPO's ``beta`` → ``dpo_beta``; reinforcement's ``compute_multiplier`` → ``grpo_group_size``
    (:data:`GROUP_PER_COMPUTE`); ``seed`` → ``recipe.seed``. ``"auto"`` takes the benchmark's value, fitted to the file
    where the track lets the run set the field (:func:`~gateway.service.recipe_field_free`): an ``"auto"`` batch is at
    most ``rows`` (a batch larger than the file repeats its rows within a step), and the learning rate's warm-up is at
    most a tenth of the job's steps (a short job otherwise ends inside the warm-up, its learning rate still near 0,
    and trains nothing it is charged for). Raises ``OutsideEditableSpace`` (403) naming the OpenAI parameter of a
    recipe field the track does not let the run set.
    """
    method = req.resolved_method()
    settings = method.settings()
    hp = settings.hyperparameters
    recipe: dict[str, Any] = {"method": METHODS[method.type]}
    if hp is not None:
        if isinstance(hp.batch_size, int):
            recipe["batch_size"] = hp.batch_size
        if isinstance(hp.learning_rate_multiplier, float | int):
            recipe["learning_rate"] = min(_DEFAULTS.learning_rate * hp.learning_rate_multiplier, 1.0)
        if isinstance(getattr(hp, "beta", None), float | int):
            recipe["dpo_beta"] = float(hp.beta)  # type: ignore[union-attr]
        if isinstance(getattr(hp, "compute_multiplier", None), float | int):
            recipe["grpo_group_size"] = max(2, min(64, round(GROUP_PER_COMPUTE * hp.compute_multiplier)))  # type: ignore[union-attr]
    if req.seed is not None:
        recipe["seed"] = req.seed
    grader = getattr(settings, "grader", None)
    create = TrainingJobCreate(model=req.model, datasets=[req.training_file], recipe=Recipe(**recipe), grader=grader)
    try:
        create = training_job(caller, create)
        fitted = create.recipe.model_dump(exclude_unset=True)
        if "batch_size" not in recipe and create.recipe.batch_size > rows and recipe_field_free(caller, "batch_size"):
            fitted["batch_size"] = max(rows, 1)
        if hp is not None and isinstance(hp.n_epochs, int):
            fitted["max_steps"] = math.ceil(hp.n_epochs * rows / fitted.get("batch_size", create.recipe.batch_size))
        warmup = fitted.get("max_steps", create.recipe.max_steps) // 10
        if create.recipe.warmup_steps > warmup and recipe_field_free(caller, "warmup_steps"):
            fitted["warmup_steps"] = warmup
        create = training_job(caller, create.model_copy(update={"recipe": Recipe(**fitted)}))
    except OutsideEditableSpace as exc:
        if not str(exc.extra.get("field", "")).startswith("recipe."):
            raise
        field = str(exc.extra["field"]).removeprefix("recipe.")
        raise OutsideEditableSpace(exc.detail.replace(f"recipe.{field}", _param(method.type, field)), field=_param(method.type, field)) from None
    return create


def resolved_hyperparameters(method: FineTuningMethod, recipe: Recipe, rows: int) -> dict[str, Any]:
    """Each hyper-parameter's value in the job (what ``"auto"`` resolved to): from the recipe the trainer runs."""
    values: dict[str, Any] = {"batch_size": recipe.batch_size,
                              "learning_rate_multiplier": round(recipe.learning_rate / _DEFAULTS.learning_rate, 6),
                              "n_epochs": round(recipe.max_steps * recipe.batch_size / max(rows, 1), 3)}
    if method.type == "dpo":
        values["beta"] = recipe.dpo_beta  # type: ignore[attr-defined]
    if method.type == "reinforcement":
        values |= {"compute_multiplier": recipe.grpo_group_size / GROUP_PER_COMPUTE, "eval_interval": "auto", "eval_samples": "auto",  # type: ignore[attr-defined]
                   "reasoning_effort": "default"}
    return values


async def create_job(gw: Gateway, caller: Caller, req: FineTuningJobCreate, *, retry_count: int, idempotency_key: str | None) -> FineTuningJobOut:
    """Create a fine-tuning job: check the training file (the run's dataset), translate (:func:`job_request`), ask the
    trainer (which holds the budget, 402 when it cannot cover the estimate), and keep the OpenAI-side record.

    Raises ``BadRequest`` (400) for a training file that is not the run's (``training_file``), the trainer's refusals
    (a format the method does not train, a model it does not serve, a grader template that reads a field the rows lack)
    as 400s naming the OpenAI parameter, ``OutsideEditableSpace`` (403), and passes a 402 or 503 through.
    """
    sha = request_sha256(req)
    if retry_count > 0 and idempotency_key is None:
        since = utcnow() - RETRY_WINDOW

        def first() -> FineTuningJob | None:
            with gw.db.session() as s:
                return repository.recent_fine_tuning_job(s, caller.run.id, sha, since)

        if (record := await run_in_threadpool(first)) is not None:
            return await job_out(gw, caller, record.job_id)
    try:
        dataset = await gw.trainer.get_dataset(caller.ctx, req.training_file)
    except UpstreamProblem as exc:
        if exc.status == 404:
            raise BadRequest(f"training_file {req.training_file!r} is not a file of this run", field="training_file") from None
        raise
    method = req.resolved_method()
    create = job_request(caller, req, dataset.rows)
    try:
        job = await gw.trainer.create_job(caller.ctx, create, idempotency_key=idempotency_key)
    except UpstreamProblem as exc:
        raise _openai_refusal(exc, method.type) from None
    record = FineTuningJob(job_id=job.id, run_id=caller.run.id, training_file=req.training_file,
                           method=method.model_dump(mode="json", exclude_none=True),
                           resolved=resolved_hyperparameters(method, job.recipe, dataset.rows), suffix=req.suffix, job_metadata=req.metadata,
                           seed=job.recipe.seed, request_sha256=sha, created_at=utcnow())

    def store() -> FineTuningJob:
        with gw.db.session() as s:
            return repository.add_fine_tuning_job(s, record)

    return _job(await run_in_threadpool(store), job)


def _openai_refusal(exc: UpstreamProblem, method: str) -> Exception:
    """The trainer's 422 as a 400 naming OpenAI's parameter (``datasets`` → ``training_file``, ``grader`` →
    ``method.reinforcement.grader``, ``recipe.<field>`` → the hyper-parameter it came from); other statuses unchanged."""
    if exc.status != 422:
        return exc
    field = str(exc.problem.get("field") or "")
    if field.startswith("datasets"):
        param = "training_file"
    elif field.startswith("grader"):
        param = "method.reinforcement." + field
    elif field.startswith("recipe."):
        param = _param(method, field.removeprefix("recipe."))
    else:
        param = field or None
    return BadRequest(str(exc.problem.get("detail", exc)), field=param, line=exc.problem.get("line"))


def _job(record: FineTuningJob, job: TrainingJobOut) -> FineTuningJobOut:
    """The trainer's ``job`` and the gateway's ``record`` of it as OpenAI's job object."""
    method = dict(record.method)
    settings = dict(method.get(method["type"]) or {})
    settings["hyperparameters"] = dict(record.resolved)
    method[method["type"]] = settings
    failed = job.status == "failed"
    return FineTuningJobOut(
        id=job.id, created_at=int(job.created_at.timestamp()), finished_at=_unix(job.finished_at),
        error=FineTuningJobError(code="training_failed", message=job.error or "the job failed", param=None) if failed else None,
        fine_tuned_model=job.latest_checkpoint if job.status == "succeeded" else None,
        hyperparameters={k: v for k, v in record.resolved.items() if k in ("batch_size", "learning_rate_multiplier", "n_epochs")},
        method=method, model=job.model, organization_id=record.run_id, seed=record.seed, status=STATUS[job.status],
        trained_tokens=job.trained_tokens, training_file=record.training_file, metadata=record.job_metadata, user_provided_suffix=record.suffix,
    )


def _record(gw: Gateway, caller: Caller, job_id: str) -> FineTuningJob:
    with gw.db.session() as s:
        record = repository.fine_tuning_job(s, caller.run.id, job_id)
        if record is None:
            raise NotFound(f"fine-tuning job {job_id!r} not found", field="fine_tuning_job_id")
        return record


async def job_out(gw: Gateway, caller: Caller, job_id: str) -> FineTuningJobOut:
    """The run's fine-tuning job ``job_id``; ``NotFound`` if it is another run's or was not created through this API."""
    record = await run_in_threadpool(_record, gw, caller, job_id)
    return _job(record, await gw.trainer.get_job(caller.ctx, job_id))


def _page(items: list[Any], after: str | None, limit: int, key: Any) -> CursorPage[Any]:
    """``items`` (in order) after the one whose ``key`` is ``after``, at most ``limit``; ``NotFound`` for an unknown ``after``."""
    start = 0
    if after is not None:
        keys = [key(i) for i in items]
        if after not in keys:
            raise NotFound(f"after={after!r} is not an id of this list", field="after")
        start = keys.index(after) + 1
    data = items[start:start + limit]
    return CursorPage(data=data, has_more=start + limit < len(items), first_id=key(data[0]) if data else None,
                      last_id=key(data[-1]) if data else None)


async def list_jobs(gw: Gateway, caller: Caller, *, after: str | None, limit: int, metadata: dict[str, str]) -> CursorPage[FineTuningJobOut]:
    """The run's fine-tuning jobs, newest first, those whose metadata holds every pair of ``metadata``."""

    def records() -> list[FineTuningJob]:
        with gw.db.session() as s:
            return repository.fine_tuning_jobs(s, caller.run.id)

    found = [r for r in await run_in_threadpool(records) if all((r.job_metadata or {}).get(k) == v for k, v in metadata.items())]
    jobs = {j.id: j for j in (await gw.trainer.list_jobs(caller.ctx)).data}
    page = _page(found, after, limit, lambda r: r.job_id)
    return CursorPage(data=[_job(r, jobs[r.job_id]) for r in page.data], has_more=page.has_more, first_id=page.first_id, last_id=page.last_id)


async def cancel_job(gw: Gateway, caller: Caller, job_id: str) -> FineTuningJobOut:
    """Cancel the job (it stops after its current step; what it trained is charged, the rest released). A job that has
    ended is a 400 (``BadRequest``), as OpenAI answers, not the trainer's 409: the SDK would repeat a 409."""
    record = await run_in_threadpool(_record, gw, caller, job_id)
    try:
        job = await gw.trainer.cancel_job(caller.ctx, job_id)
    except UpstreamProblem as exc:
        if exc.status == 409:
            raise BadRequest(str(exc.problem.get("detail", exc)), field="fine_tuning_job_id") from None
        raise
    return _job(record, job)


def _event(job_id: str, e: JobEventOut, max_steps: int) -> FineTuningEventOut:
    """A trainer event as OpenAI's: a step's metrics (``type: metrics``, ``train_loss`` and ``total_steps`` added)."""
    metrics = e.type == "step"
    data = dict(e.data)
    if metrics:
        data |= {"total_steps": max_steps, **({"train_loss": data["loss"]} if "loss" in data else {})}
    message = f"Step {data.get('step')}/{max_steps}: training loss={data['loss']:.4f}" if metrics and "loss" in data else e.message
    return FineTuningEventOut(id=f"ftevent_{job_id.removeprefix('job_')}_{e.seq}", created_at=int(e.created_at.timestamp()), level=e.level,
                              message=message, data=data, type="metrics" if metrics else "message")


async def list_events(gw: Gateway, caller: Caller, job_id: str, *, after: str | None, limit: int) -> CursorPage[FineTuningEventOut]:
    """The job's events, newest first (OpenAI's order); ``after`` is an event id of an earlier page."""
    await run_in_threadpool(_record, gw, caller, job_id)
    job = await gw.trainer.get_job(caller.ctx, job_id)
    events = (await gw.trainer.job_events(caller.ctx, job_id, after=0, limit=5000)).data
    out = [_event(job_id, e, job.recipe.max_steps) for e in reversed(events)]
    return _page(out, after, limit, lambda e: e.id)


def _checkpoint(c: CheckpointOut) -> FineTuningCheckpointOut:
    metrics = {"step": float(c.step)} | {k: float(v) for k, v in c.metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    if "loss" in metrics:
        metrics["train_loss"] = metrics["loss"]
    return FineTuningCheckpointOut(id=c.id, created_at=int(c.created_at.timestamp()), fine_tuned_model_checkpoint=c.id, fine_tuning_job_id=c.job_id,
                                   metrics=metrics, step_number=c.step)


async def list_checkpoints(gw: Gateway, caller: Caller, job_id: str, *, after: str | None, limit: int) -> CursorPage[FineTuningCheckpointOut]:
    """The job's checkpoints, newest first; each ``fine_tuned_model_checkpoint`` is a model name (``ckpt_…``)."""
    await run_in_threadpool(_record, gw, caller, job_id)
    checkpoints = (await gw.trainer.job_checkpoints(caller.ctx, job_id)).data
    out = [_checkpoint(c) for c in sorted(checkpoints, key=lambda c: c.step, reverse=True)]
    return _page(out, after, limit, lambda c: c.id)


async def list_files(gw: Gateway, caller: Caller, *, after: str | None, limit: int, order: str) -> CursorPage[FileObject]:
    """The run's files (datasets), by creation time (``order``: ``desc``, OpenAI's default, or ``asc``)."""
    files = [file_object(d) for d in (await gw.trainer.list_datasets(caller.ctx)).data]
    files.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
    return _page(files, after, limit, lambda f: f.id)


ERROR_FLAGS = {"template": "invalid_variable_error", "formula": "formula_parse_error", "python_runtime": "python_grader_runtime_error",
               "python_timeout": "python_grader_server_error", "model_parse": "model_grader_parse_error", "model_server": "model_grader_server_error"}
"""A grader result's ``error`` kind → the flag of OpenAI's ``metadata.errors`` that says it."""


def grader_run_out(req: GraderRunParams, result: GraderResult) -> GraderRunOut:
    """The grader service's result for one sample as OpenAI's ``graders.run`` answer: the reward, the parts of a
    ``multi`` grader, and ``metadata.errors`` with the flag of what went wrong set (and its details)."""
    errors: dict[str, Any] = dict.fromkeys((*ERROR_FLAGS.values(), "other_error", "sample_parse_error", "truncated_observation_error",
                                            "unresponsive_reward_error", "model_grader_refusal_error"), False)
    if result.error:
        errors[ERROR_FLAGS.get(result.error, "other_error")] = True
        errors["python_grader_runtime_error_details" if result.error.startswith("python") else "model_grader_server_error_details"] = result.error_details
    metadata = {"name": req.grader.name, "type": req.grader.type, "errors": errors, "execution_time": 0.0, "scores": result.sub_rewards,
                "token_usage": result.model_tokens, "sampled_model_name": None}
    return GraderRunOut(reward=result.reward, sub_rewards=result.sub_rewards, metadata=metadata, model_grader_token_usage_per_model={})
