"""Trainer logic: dataset validation and storage, job creation under a budget hold, the training run.

No HTTP here. Errors are ``services.common.errors`` exceptions; ``api.py`` maps nothing itself.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from trainer_service.models import Checkpoint, Dataset, JobEvent, TrainingJob
from trainer_service.schemas import ParsedDataset, SFTRow, parse_dataset

from services.common import artifacts, jobs
from services.common.auth import RunContext
from services.common.llms import BASE_MODELS, base_model_dir
from services.common.contracts import CheckpointOut, DatasetOut, JobEventOut, Recipe, TrainingJobCreate, TrainingJobOut
from services.common.db import Database, utcnow
from services.common.errors import Conflict, IdempotencyKeyReused, NotFound, Unprocessable, UpstreamUnavailable
from services.common.http import ServiceClient, ledger_client, settle_hold
from services.common.ids import has_prefix, new_id
from services.common.lazy import once
from services.common.settings import ServiceSettings

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})
log = structlog.get_logger("trainer")

if TYPE_CHECKING:
    from trainer_service.training import Example


@dataclass
class Runtime:
    """The trainer's settings, database and ledger client (one per process)."""

    settings: ServiceSettings
    db: Database
    ledger: ServiceClient


@once
def runtime() -> Runtime:
    settings = ServiceSettings()
    return Runtime(
        settings=settings,
        db=Database(settings.database_url_for("trainer")),
        ledger=ledger_client(settings),
    )


# --------------------------------------------------------------------------- datasets


def _dataset_out(ds: Dataset) -> DatasetOut:
    return DatasetOut(id=ds.id, name=ds.name, format=ds.format, rows=ds.rows, bytes=ds.bytes, sha256=ds.sha256, created_at=ds.created_at)  # type: ignore[arg-type]


def create_dataset(ctx: RunContext, name: str, data: bytes) -> DatasetOut:
    """Validate and store a JSONL upload for the run; the same content uploaded twice returns the first dataset.

    Raises ``Unprocessable`` naming the ``line`` and ``field`` of the first row the trainer could not train
    on (see ``trainer_service.schemas.parse_dataset``).
    """
    rt = runtime()
    parsed = parse_dataset(data)
    fmt, rows = parsed.format, len(parsed.rows)
    digest = hashlib.sha256(data).hexdigest()
    uri = artifacts.put_bytes(rt.settings.artifacts_dir, f"datasets/{digest}.jsonl", data)
    with rt.db.session() as s:
        existing = s.scalar(select(Dataset).where(Dataset.run_id == ctx.run_id, Dataset.sha256 == digest))
        if existing is not None:
            return _dataset_out(existing)
        ds = Dataset(id=new_id("ds"), run_id=ctx.run_id, name=name, format=fmt, sha256=digest, rows=rows, bytes=len(data), uri=uri, created_at=utcnow())
        s.add(ds)
        s.flush()
        return _dataset_out(ds)


def list_datasets(ctx: RunContext) -> list[DatasetOut]:
    with runtime().db.session() as s:
        return [_dataset_out(d) for d in s.scalars(select(Dataset).where(Dataset.run_id == ctx.run_id).order_by(Dataset.id))]


def get_dataset(ctx: RunContext, dataset_id: str) -> DatasetOut:
    """The run's dataset; another run's or an unknown id → ``NotFound``."""
    with runtime().db.session() as s:
        return _dataset_out(_owned_dataset(s, ctx, dataset_id))


def _owned_dataset(s: Session, ctx: RunContext, dataset_id: str) -> Dataset:
    ds = s.get(Dataset, dataset_id)
    if ds is None or ds.run_id != ctx.run_id:
        raise NotFound(f"dataset {dataset_id} not found", field="datasets")
    return ds


def dataset_content(ctx: RunContext, dataset_id: str) -> bytes:
    """The stored JSONL bytes of the run's dataset; ``NotFound`` for another run's or an unknown id."""
    with runtime().db.session() as s:
        uri = _owned_dataset(s, ctx, dataset_id).uri
    return artifacts.local_path(uri).read_bytes()


def read_dataset(ds: Dataset) -> ParsedDataset:
    """A stored dataset's rows, validated again by the upload's rules; ``Unprocessable`` naming the dataset,
    ``line`` and ``field`` if it no longer passes them."""
    try:
        return parse_dataset(artifacts.local_path(ds.uri).read_bytes())
    except Unprocessable as exc:
        raise Unprocessable(f"dataset {ds.id}: {exc.detail}", dataset=ds.id, **exc.extra) from None


# --------------------------------------------------------------------------- jobs


def _job_out(s: Session, job: TrainingJob) -> TrainingJobOut:
    latest = s.scalar(select(Checkpoint.id).where(Checkpoint.job_id == job.id).order_by(Checkpoint.step.desc()).limit(1))
    return TrainingJobOut(
        id=job.id, status=job.status, model=job.parent_checkpoint_id or job.base_model, base_model=job.base_model,  # type: ignore[arg-type]
        datasets=job.dataset_ids, recipe=Recipe(**job.recipe), steps_done=job.steps_done, estimated_tokens=job.estimated_tokens,
        trained_tokens=job.trained_tokens, latest_checkpoint=latest, attempts=job.attempts, error=job.error, created_at=job.created_at,
        started_at=job.started_at, finished_at=job.finished_at,
    )


def _resolve_model(s: Session, ctx: RunContext, model: str) -> tuple[str, Checkpoint | None]:
    """``(base_model, parent_checkpoint)`` for a base name or one of the run's checkpoints; else 422."""
    if has_prefix(model, "ckpt"):
        ckpt = s.get(Checkpoint, model)
        if ckpt is None or ckpt.run_id != ctx.run_id:
            raise Unprocessable(f"unknown checkpoint {model!r}", field="model")
        return ckpt.base_model, ckpt
    if model not in BASE_MODELS:
        raise Unprocessable(f"unknown base model {model!r}; available: {', '.join(sorted(BASE_MODELS))}", field="model")
    return model, None


def training_examples(base_model: str, datasets: list[Dataset], recipe: Recipe) -> list[Example]:
    """The datasets' rows tokenized as training will (``training.tokenize_examples``), with ``base_model``'s
    tokenizer (loaded once per process).

    Raises ``Unprocessable``: ``field="datasets"`` for a dataset whose format the method does not train;
    ``field="datasets"`` with ``rows`` (how many), ``dataset`` and ``line`` (the first of them) when rows have
    no supervised token left after truncation at ``recipe.max_seq_len``; a row's ``field`` and ``line`` for a
    stored row that fails validation.
    """
    from trainer_service.training import NoSupervisedTokens, tokenize_examples

    rows: list[SFTRow] = []
    where: list[tuple[str, int]] = []  # (dataset id, 1-based line) of each row
    for ds in datasets:
        parsed = read_dataset(ds)
        if parsed.format not in ("messages", "prompt_completion"):
            raise Unprocessable(f"dataset {ds.id} is {parsed.format}; sft needs messages or prompt_completion rows", field="datasets", dataset=ds.id)
        rows += parsed.rows  # type: ignore[arg-type]
        where += [(ds.id, line) for line in parsed.lines]
    try:
        return tokenize_examples(_tokenizer(base_model), rows, recipe.max_seq_len)
    except NoSupervisedTokens as exc:
        dataset_id, line = where[exc.indices[0]]
        raise Unprocessable(
            f"{len(exc.indices)} row(s) have no answer token left after truncation at recipe.max_seq_len={recipe.max_seq_len} tokens "
            f"(the prompt alone fills it), so they would train on nothing; the first is line {line} of dataset {dataset_id}. "
            "Shorten their prompts or raise max_seq_len.", field="datasets", rows=len(exc.indices), dataset=dataset_id, line=line) from None


@cache
def _tokenizer(base_model: str):  # noqa: ANN202
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(base_model_dir(base_model, runtime().settings.models_dir))


def sft_config(recipe: Recipe):  # noqa: ANN201 - avoids importing torch in the API process at import time
    """The ``SFTConfig`` of a recipe (same field names)."""
    from trainer_service.training import SFTConfig

    fields = recipe.model_dump(exclude={"method", "adapter", "lr_scheduler"})
    return SFTConfig(**fields, lr_scheduler_type=recipe.lr_scheduler)


def create_job(ctx: RunContext, req: TrainingJobCreate, idempotency_key: str | None = None) -> TrainingJobOut:
    """Validate a job, place its budget hold, record it as ``queued`` and return it.

    Raises ``Unprocessable`` (unsupported method, unknown model/checkpoint, dataset format, rows with no
    answer token left after truncation at ``max_seq_len``: see :func:`training_examples`), ``NotFound``
    (a dataset that is not the run's), ``Conflict`` (``idempotency_key`` used before with another request)
    and passes the ledger's 402 through. The job row is written only after the hold succeeded, and the hold
    is released if writing fails: nothing is half-written. With ``idempotency_key`` the call is safe to
    repeat: the ledger hold carries a key derived from it (a retry after a lost answer finds the same hold)
    and a repeat returns the job created first.
    """
    from trainer_service.training import count_training_tokens

    rt = runtime()
    recipe = req.recipe
    fingerprint = hashlib.sha256(req.model_dump_json().encode()).hexdigest()
    if idempotency_key and (existing := _job_by_key(ctx, idempotency_key, fingerprint)) is not None:
        return existing
    if recipe.method != "sft":
        raise Unprocessable(f"recipe.method {recipe.method!r} is not available in this deployment (supported: sft)", field="recipe.method")
    if recipe.adapter != "lora":
        raise Unprocessable("recipe.adapter 'full' is not available on CPU deployments (supported: lora)", field="recipe.adapter")
    with rt.db.session() as s:
        base_model, parent = _resolve_model(s, ctx, req.model)
        datasets = [_owned_dataset(s, ctx, d) for d in req.datasets]
    examples = training_examples(base_model, datasets, recipe)
    tokens = count_training_tokens(examples, sft_config(recipe))
    job_id = new_id("job")
    request = f"(Idempotency-Key {idempotency_key})" if idempotency_key else job_id
    hold_key = f"hold:job:{hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]}" if idempotency_key else f"hold:{job_id}"
    for _ in range(3):
        hold = rt.ledger.post("/internal/holds", json={
            "account_id": ctx.run_id, "purpose": f"training job {request}",
            "usage": [{"kind": "training_tokens", "quantity": tokens, "model": base_model}],
            "idempotency_key": hold_key,
            "ttl_s": int(rt.settings.train_time_limit_s) + 3600,  # outlives the job's time limit: expires only if orphaned
        })
        # a retry with the same key gets the first attempt's hold back; if that attempt failed, it released it
        if not idempotency_key or rt.ledger.get(f"/internal/holds/{hold['hold_id']}")["status"] == "open":
            break
        hold_key = f"{hold_key}:after:{hold['hold_id']}"
    else:
        raise Conflict("could not place an open hold for this Idempotency-Key; retry with a new key", field="Idempotency-Key")
    try:
        with rt.db.session() as s:
            job = TrainingJob(
                id=job_id, run_id=ctx.run_id, status="queued", method=recipe.method, recipe=recipe.model_dump(),
                dataset_ids=[d.id for d in datasets], base_model=base_model, parent_checkpoint_id=parent.id if parent else None,
                hold_id=hold["hold_id"], idempotency_key=idempotency_key, request_sha256=fingerprint,
                estimated_tokens=tokens, created_at=utcnow(), enqueued_at=utcnow(),
            )
            s.add(job)
            s.flush()
            _event(s, job.id, "info", "validated", f"validated {len(examples)} examples from {len(datasets)} dataset(s); "
                   f"estimated ≤{tokens} training tokens, hold {hold['amount_usd_micros']} µUSD", {"rows": len(examples), "estimated_tokens": tokens, "hold_usd_micros": hold["amount_usd_micros"]})
            out = _job_out(s, job)
    except IntegrityError:  # the same key was used concurrently and the other request wrote its job first
        if idempotency_key and (existing := _job_by_key(ctx, idempotency_key, fingerprint)) is not None:
            return existing
        raise
    except Exception:
        rt.ledger.post(f"/internal/holds/{hold['hold_id']}/release", json={"idempotency_key": f"release:{hold['hold_id']}"})
        raise
    from trainer_service.tasks import enqueue_training

    enqueue_training(job_id)
    return out


def _job_by_key(ctx: RunContext, idempotency_key: str, fingerprint: str) -> TrainingJobOut | None:
    """The run's job created with ``idempotency_key``; ``Conflict`` if it was created from another request."""
    with runtime().db.session() as s:
        job = s.scalar(select(TrainingJob).where(TrainingJob.run_id == ctx.run_id, TrainingJob.idempotency_key == idempotency_key))
        if job is None:
            return None
        if job.request_sha256 != fingerprint:
            raise IdempotencyKeyReused(f"Idempotency-Key {idempotency_key!r} was used for a different training job request ({job.id})",
                                       field="Idempotency-Key")
        return _job_out(s, job)


def _event(s: Session, job_id: str, level: str, type_: str, message: str, data: dict[str, Any] | None = None) -> None:
    s.add(JobEvent(job_id=job_id, level=level, type=type_, message=message, data=data or {}, created_at=utcnow()))


def _owned_job(s: Session, ctx: RunContext, job_id: str, *, lock: bool = False) -> TrainingJob:
    job = s.get(TrainingJob, job_id, with_for_update=lock)
    if job is None or job.run_id != ctx.run_id:
        raise NotFound(f"training job {job_id} not found")
    return job


def list_jobs(ctx: RunContext) -> list[TrainingJobOut]:
    with runtime().db.session() as s:
        return [_job_out(s, j) for j in s.scalars(select(TrainingJob).where(TrainingJob.run_id == ctx.run_id).order_by(TrainingJob.id))]


def get_job(ctx: RunContext, job_id: str) -> TrainingJobOut:
    with runtime().db.session() as s:
        return _job_out(s, _owned_job(s, ctx, job_id))


def list_events(ctx: RunContext, job_id: str, after: int = 0, limit: int = 500) -> list[JobEventOut]:
    """Events of the run's job with ``seq > after``, oldest first (poll with the last ``seq`` seen)."""
    with runtime().db.session() as s:
        _owned_job(s, ctx, job_id)
        rows = s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after).order_by(JobEvent.seq).limit(limit))
        return [JobEventOut(seq=e.seq, level=e.level, type=e.type, message=e.message, data=e.data, created_at=e.created_at) for e in rows]  # type: ignore[arg-type]


def _checkpoint_out(c: Checkpoint) -> CheckpointOut:
    return CheckpointOut(id=c.id, job_id=c.job_id, step=c.step, base_model=c.base_model, kind=c.kind, metrics=c.metrics, created_at=c.created_at)  # type: ignore[arg-type]


def list_checkpoints(ctx: RunContext, job_id: str) -> list[CheckpointOut]:
    with runtime().db.session() as s:
        _owned_job(s, ctx, job_id)
        return [_checkpoint_out(c) for c in s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step))]


def cancel_job(ctx: RunContext, job_id: str) -> TrainingJobOut:
    """Stop a job. A queued job is cancelled at once and its hold released; a running one stops after its
    current step and is charged for the steps it trained. ``Conflict`` if the job already ended."""
    rt = runtime()
    with rt.db.session() as s:
        job = _owned_job(s, ctx, job_id, lock=True)  # a worker's claim waits for this transaction
        if job.status in TERMINAL:
            raise Conflict(f"training job {job_id} is already {job.status}")
        job.cancel_requested = True
        _event(s, job.id, "info", "cancel_requested", "cancellation requested")
        if job.status == "queued":  # no worker has it: nobody else will write this row (claims need ``queued``)
            _finish(s, job, "cancelled", None)
        out = _job_out(s, job)
    if out.status == "cancelled":
        try:
            _settle(job_id)
        except UpstreamUnavailable:  # the job is cancelled; the reconciler settles its hold once the ledger is back
            log.warning("ledger unavailable; the cancelled job's hold is settled later", job_id=job_id)
    return out


def checkpoint_record(checkpoint_id: str, run_id: str | None) -> dict[str, Any]:
    """``{id, run_id, base_model, uri, kind, step}`` for the inference service; 404 if unknown or not ``run_id``'s."""
    with runtime().db.session() as s:
        c = s.get(Checkpoint, checkpoint_id)
        if c is None or (run_id is not None and c.run_id != run_id):
            raise NotFound(f"checkpoint {checkpoint_id} not found")
        return {"id": c.id, "run_id": c.run_id, "base_model": c.base_model, "uri": c.uri, "kind": c.kind, "step": c.step}


# --------------------------------------------------------------------------- the worker's side


def run_job(job_id: str) -> None:
    """Run a queued job to the end in this worker process: train, write checkpoints, settle the hold.

    The row's status is the truth: the worker claims the job (``queued`` → ``running`` under its id, see
    ``services.common.jobs``), so a duplicate message finds nothing to do, and heartbeats while it trains.
    A job that already has checkpoints (an earlier attempt died) resumes from the newest one, with its token
    count reset to that checkpoint's, so no step is charged twice. Events record every step's loss, learning
    rate, tokens and tokens/s. The hold is settled with the tokens actually processed, whatever the outcome
    (charge equals work done). If the lease is lost (the watchdog failed the job, or it was given to another
    worker) training stops and this worker writes nothing more.
    """
    from trainer_service.training import train_sft

    rt = runtime()
    if not jobs.claim(rt.db, TrainingJob, job_id):
        return
    with rt.db.session() as s:
        job = s.get(TrainingJob, job_id)
        if job.cancel_requested:
            _finish(s, job, "cancelled", None)
            job_snapshot = None
        else:
            latest = s.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc()).limit(1))
            resume = artifacts.local_path(latest.uri) if latest is not None else None
            if latest is not None:
                job.steps_done = latest.step
                job.trained_tokens = int(latest.metrics.get("trained_tokens", job.trained_tokens))
                _event(s, job.id, "warn", "resumed", f"attempt {job.attempts}: resuming from checkpoint {latest.id} at step {latest.step}",
                       {"step": latest.step, "checkpoint": latest.id, "attempt": job.attempts})
            else:
                job.steps_done, job.trained_tokens = 0, 0
                _event(s, job.id, "info", "started", f"training started (attempt {job.attempts})", {"attempt": job.attempts})
            job_snapshot = (job.recipe, job.dataset_ids, job.base_model, job.parent_checkpoint_id)
    if job_snapshot is None:
        _settle(job_id)
        return
    recipe_d, dataset_ids, base_model, parent_id = job_snapshot
    with rt.db.session() as s:
        parent_dir = artifacts.local_path(s.get(Checkpoint, parent_id).uri) if parent_id else None  # type: ignore[union-attr]
    recipe = Recipe(**recipe_d)
    workdir = Path(tempfile.mkdtemp(prefix=f"{job_id}-", dir=rt.settings.data_dir))
    lease = jobs.Lease(rt.db, TrainingJob, job_id, rt.settings.job_heartbeat_s)


    def on_step(m) -> None:  # noqa: ANN001
        with rt.db.session() as s:
            job = lease.row(s)
            job.steps_done = m.step
            job.trained_tokens += m.tokens
            job.heartbeat_at = utcnow()
            _event(s, job_id, "info", "step", f"step {m.step}/{m.max_steps} loss {m.loss:.4f}",
                   {"step": m.step, "max_steps": m.max_steps, "loss": m.loss, "learning_rate": m.learning_rate,
                    "tokens": m.tokens, "tokens_per_s": m.tokens_per_s, "elapsed_s": m.elapsed_s})

    def on_checkpoint(step: int, path: Path) -> None:
        ckpt_id = new_id("ckpt")
        uri = artifacts.put_dir(rt.settings.artifacts_dir, f"checkpoints/{job_id}/step-{step}", path)
        with rt.db.session() as s:
            job = lease.row(s)
            s.add(Checkpoint(id=ckpt_id, job_id=job_id, run_id=job.run_id, step=step, base_model=base_model, kind="lora", uri=uri,
                             metrics={"trained_tokens": job.trained_tokens}, created_at=utcnow()))
            _event(s, job_id, "info", "checkpoint", f"checkpoint {ckpt_id} at step {step}", {"checkpoint": ckpt_id, "step": step})

    def should_stop() -> bool:
        if lease.lost.is_set():
            return True
        with rt.db.session() as s:
            return bool(s.get(TrainingJob, job_id).cancel_requested)  # type: ignore[union-attr]

    try:
        with lease:
            with rt.db.session() as s:  # validated again: a dataset stored under older rules fails the job, not the worker
                rows = [row for d in dataset_ids for row in read_dataset(s.get(Dataset, d)).rows]  # type: ignore[arg-type]
            result = train_sft(
                base_model_dir(base_model, rt.settings.models_dir), rows, sft_config(recipe), workdir,
                init_adapter=parent_dir, resume=resume, on_step=on_step, on_checkpoint=on_checkpoint, should_stop=should_stop,
            )
            outcome, error = ("cancelled" if result.stopped else "succeeded"), None
    except jobs.LeaseLost:
        outcome, error = None, None
    except Exception as exc:  # the job fails; the worker lives on
        log.exception("training job failed", job_id=job_id)
        outcome, error = "failed", f"{exc.__class__.__name__}: {exc}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if outcome is None or lease.lost.is_set():
        log.warning("lease lost; leaving the job to its new owner", job_id=job_id)
        return
    with rt.db.session() as s:
        job = jobs.owned_row(s, TrainingJob, job_id)
        if job is None:
            return
        _finish(s, job, outcome, error)
    _settle(job_id)


def reconcile() -> jobs.ReconcileReport:
    """One reconciler round over training jobs (see ``services.common.jobs.reconcile``).

    Runs every ``reconcile_interval_s`` in the trainer service and once when a train worker starts. A job
    whose worker is gone is queued again (it resumes from its newest checkpoint), or cancelled if a cancel
    was asked for; one past ``train_time_limit_s`` fails with its hold settled for the tokens it trained; a
    queued job whose message may be lost is sent again; a finished job whose hold is still open is settled.
    """
    from trainer_service.tasks import enqueue_training

    rt = runtime()

    def requeued(s: Session, job: TrainingJob) -> None:
        _event(s, job.id, "warn", "worker_lost", f"the worker running this job ({job.attempts} attempt(s) so far) stopped; "
               "the job is queued again and resumes from its newest checkpoint")

    def failed(s: Session, job: TrainingJob, reason: str) -> None:
        _finish(s, job, "failed", reason)

    report = jobs.reconcile(rt.db, TrainingJob, rt.settings.reconcile_policy(rt.settings.train_time_limit_s),
                            send=enqueue_training, on_requeue=requeued, on_fail=failed, after_fail=_settle)
    with rt.db.session() as s:  # cancelled while its worker was lost: nobody will claim it to notice
        doomed = s.scalars(select(TrainingJob.id).where(TrainingJob.status == "queued", TrainingJob.cancel_requested.is_(True))).all()
    for job_id in doomed:
        with rt.db.session() as s:
            job = s.get(TrainingJob, job_id, with_for_update=True)
            if job is None or job.status != "queued":
                continue
            _finish(s, job, "cancelled", None)
        try:
            _settle(job_id)
        except UpstreamUnavailable:
            log.warning("ledger unavailable; the cancelled job's hold is settled later", job_id=job_id)
    return report


def _finish(s: Session, job: TrainingJob, status: str, error: str | None) -> None:
    job.status = status
    job.error = error
    job.worker_id = None
    job.finished_at = utcnow()
    _event(s, job.id, "error" if error else "info", status, error or f"job {status} after {job.steps_done} steps, {job.trained_tokens} tokens")


def _settle(job_id: str) -> None:
    """Settle the job's hold with the tokens it processed (idempotent: one settle per job) and note it.

    Raises ``UpstreamUnavailable`` while the ledger is away; the reconciler settles finished jobs whose
    hold is still open.
    """
    rt = runtime()
    with rt.db.session() as s:
        job = s.get(TrainingJob, job_id)
        hold_id, tokens, base_model = job.hold_id, job.trained_tokens, job.base_model  # type: ignore[union-attr]
    if hold_id is None:
        return
    usage = [{"kind": "training_tokens", "quantity": tokens, "model": base_model}] if tokens else []
    settle_hold(rt.ledger, hold_id, usage, f"settle:{job_id}")
    with rt.db.session() as s:
        s.get(TrainingJob, job_id).hold_closed_at = utcnow()  # type: ignore[union-attr]
