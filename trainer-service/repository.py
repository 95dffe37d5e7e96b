"""Queries of the trainer's database: a run's datasets, training jobs, their events and checkpoints. Each takes the
caller's session; the rules (validation, holds, a job's lifecycle) are in ``datasets``, ``jobs`` and ``worker``."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session
from trainer_service.models import Checkpoint, Dataset, JobEvent, LiveModel, PrimitiveRequest, SavedWeights, TrainingJob

from services.common.auth import RunContext
from services.common.db import utcnow
from services.common.errors import NotFound

# --------------------------------------------------------------------------- datasets


def owned_dataset(s: Session, ctx: RunContext, dataset_id: str) -> Dataset:
    """The row of the run's dataset ``dataset_id``; ``NotFound`` (``field="datasets"``) for another run's or an unknown id."""
    ds = s.get(Dataset, dataset_id)
    if ds is None or ds.run_id != ctx.run_id:
        raise NotFound(f"dataset {dataset_id} not found", field="datasets")
    return ds


def datasets(s: Session, dataset_ids: list[str]) -> list[Dataset]:
    """The rows of ``dataset_ids``, in that order, whatever their run (a job's, checked when it was created); ``NotFound`` for an unknown id."""
    rows = [s.get(Dataset, d) for d in dataset_ids]
    if None in rows:
        raise NotFound(f"dataset {dataset_ids[rows.index(None)]} not found", field="datasets")
    return rows  # type: ignore[return-value]


def run_datasets(s: Session, ctx: RunContext) -> list[Dataset]:
    """The run's datasets, oldest first."""
    return list(s.scalars(select(Dataset).where(Dataset.run_id == ctx.run_id).order_by(Dataset.id)))


def dataset_by_digest(s: Session, ctx: RunContext, sha256: str) -> Dataset | None:
    """The run's dataset whose content has digest ``sha256``, if it uploaded it."""
    return s.scalar(select(Dataset).where(Dataset.run_id == ctx.run_id, Dataset.sha256 == sha256))


def add_dataset(s: Session, ctx: RunContext, dataset_id: str, *, name: str, fmt: str, sha256: str, rows: int, size: int, uri: str) -> Dataset:
    """Add the run's dataset (``size`` bytes stored at ``uri``, ``rows`` rows of format ``fmt``), flushed; returns its row."""
    ds = Dataset(id=dataset_id, run_id=ctx.run_id, name=name, format=fmt, sha256=sha256, rows=rows, bytes=size, uri=uri, created_at=utcnow())
    s.add(ds)
    s.flush()
    return ds


# --------------------------------------------------------------------------- training jobs


def training_job(s: Session, job_id: str, *, lock: bool = False) -> TrainingJob | None:
    """Job ``job_id``'s row (``lock``: ``SELECT … FOR UPDATE``), whatever its run; ``None`` if unknown."""
    return s.get(TrainingJob, job_id, with_for_update=lock)


def owned_job(s: Session, ctx: RunContext, job_id: str, *, lock: bool = False) -> TrainingJob:
    """The run's job ``job_id`` (``lock``: ``SELECT … FOR UPDATE``); ``NotFound`` for another run's or an unknown id."""
    job = training_job(s, job_id, lock=lock)
    if job is None or job.run_id != ctx.run_id:
        raise NotFound(f"training job {job_id} not found")
    return job


def run_jobs(s: Session, ctx: RunContext) -> list[TrainingJob]:
    """The run's jobs, oldest first."""
    return list(s.scalars(select(TrainingJob).where(TrainingJob.run_id == ctx.run_id).order_by(TrainingJob.id)))


def job_by_idempotency_key(s: Session, ctx: RunContext, idempotency_key: str) -> TrainingJob | None:
    """The run's job created with ``idempotency_key``, if there is one."""
    return s.scalar(select(TrainingJob).where(TrainingJob.run_id == ctx.run_id, TrainingJob.idempotency_key == idempotency_key))


def add_job(s: Session, ctx: RunContext, job_id: str, *, method: str, recipe: dict[str, Any], dataset_ids: list[str], base_model: str,
            parent_checkpoint_id: str | None, hold_id: str, estimated_tokens: int, merge: dict[str, Any] | None,
            harness: dict[str, Any] | None, grader: dict[str, Any] | None, run_context: dict[str, Any] | None, idempotency_key: str | None,
            request_sha256: str) -> TrainingJob:
    """Add the run's job ``queued``, flushed: ``IntegrityError`` if the run has a job with ``idempotency_key``; returns its row."""
    job = TrainingJob(id=job_id, run_id=ctx.run_id, status="queued", method=method, merge=merge, run_context=run_context, harness=harness, grader=grader,
                      recipe=recipe, dataset_ids=dataset_ids, base_model=base_model, parent_checkpoint_id=parent_checkpoint_id, hold_id=hold_id,
                      idempotency_key=idempotency_key, request_sha256=request_sha256, estimated_tokens=estimated_tokens,
                      created_at=utcnow(), enqueued_at=utcnow())
    s.add(job)
    s.flush()
    return job


def queued_jobs_to_cancel(s: Session) -> list[str]:
    """Ids of the ``queued`` jobs whose cancellation was asked for."""
    return list(s.scalars(select(TrainingJob.id).where(TrainingJob.status == "queued", TrainingJob.cancel_requested.is_(True))))


# --------------------------------------------------------------------------- events


def add_event(s: Session, job_id: str, level: str, type_: str, message: str, data: dict[str, Any] | None = None) -> None:
    """Append an event (``level`` info | warn | error) to job ``job_id``'s log."""
    s.add(JobEvent(job_id=job_id, level=level, type=type_, message=message, data=data or {}, created_at=utcnow()))


def events_after(s: Session, job_id: str, after: int, limit: int) -> list[JobEvent]:
    """At most ``limit`` of job ``job_id``'s events with ``seq > after``, oldest first."""
    return list(s.scalars(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.seq > after).order_by(JobEvent.seq).limit(limit)))


# --------------------------------------------------------------------------- checkpoints


def checkpoint(s: Session, checkpoint_id: str, run_id: str | None = None) -> Checkpoint | None:
    """Checkpoint ``checkpoint_id``'s row; ``None`` if unknown or, given ``run_id``, another run's."""
    c = s.get(Checkpoint, checkpoint_id)
    return None if c is None or (run_id is not None and c.run_id != run_id) else c


def job_checkpoints(s: Session, job_id: str) -> list[Checkpoint]:
    """Job ``job_id``'s checkpoints by step."""
    return list(s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))


def latest_checkpoint(s: Session, job_id: str) -> Checkpoint | None:
    """Job ``job_id``'s checkpoint of the highest step; ``None`` if it wrote none."""
    return s.scalar(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step.desc()).limit(1))


def add_checkpoint(s: Session, job: TrainingJob, checkpoint_id: str, *, step: int, kind: str, uri: str, metrics: dict[str, Any]) -> None:
    """Add ``job``'s checkpoint at ``step`` (of the job's base model; ``kind`` lora | full, stored at ``uri``)."""
    s.add(Checkpoint(id=checkpoint_id, job_id=job.id, run_id=job.run_id, step=step, base_model=job.base_model, kind=kind, uri=uri,
                     metrics=metrics, created_at=utcnow()))


# --------------------------------------------------------------------------- Tinker's primitives (sessions, live)


def primitive_request_at(s: Session, model_id: str, seq: int) -> PrimitiveRequest | None:
    """Live model ``model_id``'s training request at ``seq``, if one was made."""
    return s.scalar(select(PrimitiveRequest).where(PrimitiveRequest.model_id == model_id, PrimitiveRequest.seq == seq).limit(1))


def queued_primitive_request(s: Session, model_id: str) -> str | None:
    """The id of a request of live model ``model_id`` still waiting for a worker, if any."""
    return s.scalar(select(PrimitiveRequest.id).where(PrimitiveRequest.model_id == model_id, PrimitiveRequest.status == "queued").limit(1))


def session_model_on(s: Session, session_id: str, base_model: str) -> str | None:
    """The newest live model of the session over ``base_model`` (where a sampler of that base runs), if any."""
    return s.scalar(select(LiveModel.id).where(LiveModel.session_id == session_id, LiveModel.base_model == base_model)
                    .order_by(LiveModel.created_at.desc()).limit(1))


def next_checkpoint_step(s: Session, job_id: str, steps_done: int) -> int:
    """The step a live model's next checkpoint is recorded at: its optim steps so far, or one past its latest
    checkpoint's when that is higher (a state loaded in between: the steps are counted again from its own)."""
    latest = latest_checkpoint(s, job_id)
    return steps_done if latest is None or latest.step < steps_done else latest.step + 1


def saved_weights_of(s: Session, model_id: str) -> list[SavedWeights]:
    """The weights saved from live model ``model_id``, oldest first."""
    return list(s.scalars(select(SavedWeights).where(SavedWeights.model_id == model_id).order_by(SavedWeights.created_at)))


def oldest_queued_sample(s: Session, model_id: str) -> str | None:
    """The id of live model ``model_id``'s oldest queued sample (a request with no ``seq``), if any."""
    return s.scalar(select(PrimitiveRequest.id).where(PrimitiveRequest.model_id == model_id, PrimitiveRequest.status == "queued",
                                                      PrimitiveRequest.seq.is_(None)).order_by(PrimitiveRequest.created_at).limit(1))


def first_queued_training_seq(s: Session, model_id: str, after: int) -> int | None:
    """The lowest ``seq`` above ``after`` of live model ``model_id``'s queued training requests, if any."""
    return s.scalar(select(PrimitiveRequest.seq).where(PrimitiveRequest.model_id == model_id, PrimitiveRequest.status == "queued",
                                                       PrimitiveRequest.seq > after).order_by(PrimitiveRequest.seq).limit(1))


def done_training_requests(s: Session, model_id: str, after: int, through: int) -> list[PrimitiveRequest]:
    """Live model ``model_id``'s training requests done with ``after < seq <= through``, in ``seq`` order."""
    return list(s.scalars(select(PrimitiveRequest).where(PrimitiveRequest.model_id == model_id, PrimitiveRequest.seq > after,
                                                         PrimitiveRequest.seq <= through, PrimitiveRequest.status == "done")
                          .order_by(PrimitiveRequest.seq)))


def queued_primitive_requests(s: Session, model_id: str) -> list[PrimitiveRequest]:
    """Every request of live model ``model_id`` still queued."""
    return list(s.scalars(select(PrimitiveRequest).where(PrimitiveRequest.model_id == model_id, PrimitiveRequest.status == "queued")))


def live_model_of_job(s: Session, job_id: str) -> LiveModel | None:
    """The live model whose training job is ``job_id``, if it is one."""
    return s.scalar(select(LiveModel).where(LiveModel.job_id == job_id))


def session_live_models(s: Session, session_id: str) -> list[LiveModel]:
    """The live models of session ``session_id``."""
    return list(s.scalars(select(LiveModel).where(LiveModel.session_id == session_id)))


def other_job_waiting(s: Session, job_id: str) -> bool:
    """Whether a training job other than ``job_id`` is queued for a train worker."""
    return s.scalar(select(TrainingJob.id).where(TrainingJob.status == "queued", TrainingJob.id != job_id).limit(1)) is not None


def ended_live_jobs_with_requests(s: Session) -> list[str]:
    """The jobs of live models that have ended (succeeded, failed, cancelled) with a request still waiting: to fail."""
    waiting = select(PrimitiveRequest.model_id).where(PrimitiveRequest.status == "queued")
    return list(s.scalars(select(TrainingJob.id).join(LiveModel, LiveModel.job_id == TrainingJob.id)
                          .where(TrainingJob.status.in_(("succeeded", "failed", "cancelled")), LiveModel.id.in_(waiting))))


def paused_live_jobs_with_requests(s: Session) -> list[str]:
    """The jobs of live models let go by their worker (``paused``) that have a request waiting: to wake."""
    waiting = select(PrimitiveRequest.model_id).where(PrimitiveRequest.status == "queued")
    return list(s.scalars(select(TrainingJob.id).join(LiveModel, LiveModel.job_id == TrainingJob.id)
                          .where(TrainingJob.status == "paused", LiveModel.id.in_(waiting))))
