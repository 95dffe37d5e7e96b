"""ORM tables of the trainer service: datasets, training jobs, job events, checkpoints, and the sessions of Tinker's primitives."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Index, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import UTCDateTime, utcnow
from services.common.jobs import JobColumns


class Base(DeclarativeBase):
    pass


class Dataset(Base):
    """An uploaded, validated JSONL file; immutable and content-addressed (``sha256``) within a run."""

    __tablename__ = "datasets"
    __table_args__ = (UniqueConstraint("run_id", "sha256"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(20))  # messages | prompt_completion | preference | prompt_only
    sha256: Mapped[str] = mapped_column(String(64))
    rows: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)
    uri: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class TrainingJob(JobColumns, Base):
    """A training job; this row, not the queue message, is the job's state (lease columns: ``JobColumns``)."""

    __tablename__ = "training_jobs"
    __table_args__ = (UniqueConstraint("run_id", "idempotency_key", name="uq_training_jobs_run_idempotency_key"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    status: Mapped[str] = mapped_column(String(20), index=True)
    method: Mapped[str] = mapped_column(String(10))
    recipe: Mapped[dict[str, Any]] = mapped_column(JSON)
    dataset_ids: Mapped[list[str]] = mapped_column(JSON)
    merge: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # a merge job's MergeSpec
    harness: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # a grpo job's Harness (None: the grader's default)
    grader: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # a grpo job's grader spec (None: the suite's scorer rewards)
    run_context: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)  # a grpo job's RunContext: its worker calls the grader for the run
    base_model: Mapped[str] = mapped_column(String(100))
    parent_checkpoint_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    hold_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    estimated_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    trained_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    prefill_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # a grpo job's rollouts: prompt tokens computed
    decode_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # … and tokens generated
    steps_done: Mapped[int] = mapped_column(Integer, default=0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobEvent(Base):
    """One event of a job (``info|warn|error``), with metrics for training steps; ``seq`` orders them."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_seq", "job_id", "seq"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("training_jobs.id"))
    level: Mapped[str] = mapped_column(String(10))
    type: Mapped[str] = mapped_column(String(30))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Checkpoint(Base):
    """A LoRA adapter written by a job at ``step``; servable by the inference service."""

    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("training_jobs.id"), index=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    step: Mapped[int] = mapped_column(Integer)
    base_model: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(String(10), default="lora")
    uri: Mapped[str] = mapped_column(Text)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class PrimitiveSession(Base):
    """A client's session of Tinker's training primitives (``ServiceClient``): the run it acts for, its training
    clients (:class:`LiveModel`) and samplers (:class:`Sampler`). Ended by the client's ``finish`` or left to idle."""

    __tablename__ = "primitive_sessions"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    run_context: Mapped[dict[str, Any]] = mapped_column(JSON)  # the RunContext its workers meter and act under
    user_metadata: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class LiveModel(Base):
    """A Tinker training client: a LoRA adapter over ``base_model`` held by one train worker while requests come
    (``id``: Tinker's ``<session>:train:<n>``). Its training job (``job_id``, ``recipe.method: primitives``) carries
    the lease, events and checkpoints. ``applied_seq``: the last training request executed, in ``seq`` order;
    ``state_uri``: where its adapter and optimizer were last written when its worker let it go (``state_seq``)."""

    __tablename__ = "live_models"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("primitive_sessions.id"), index=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("training_jobs.id"))
    base_model: Mapped[str] = mapped_column(String(100))
    lora: Mapped[dict[str, Any]] = mapped_column(JSON)  # rank, seed, train_attn, train_mlp, train_unembed
    applied_seq: Mapped[int] = mapped_column(Integer, default=0)
    state_uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    state_seq: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class Sampler(Base):
    """A Tinker sampling client (``<session>:sample:<n>``): the weights of ``checkpoint_id`` (or the base model
    alone), sampled by the worker of live model ``model_id``."""

    __tablename__ = "primitive_samplers"

    id: Mapped[str] = mapped_column(String(120), primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("primitive_sessions.id"), index=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("live_models.id"))
    base_model: Mapped[str] = mapped_column(String(100))
    checkpoint_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    model_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class SavedWeights(Base):
    """A ``tinker://<model>/<kind>/<name>`` path a client saved: ``sampler_weights`` are a checkpoint of the run
    (``checkpoint_id``), ``weights`` an adapter with its optimizer state (``uri``)."""

    __tablename__ = "primitive_weights"

    path: Mapped[str] = mapped_column(String(400), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    model_id: Mapped[str] = mapped_column(String(120))
    kind: Mapped[str] = mapped_column(String(20))  # sampler_weights | weights
    checkpoint_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    uri: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class PrimitiveRequest(Base):
    """One request of a client (a Tinker future): what it asks (``kind``, ``payload``: protobuf for
    ``forward_backward``, JSON otherwise), of which live model, in which training order (``seq``; ``None`` for a
    sample), its budget hold, and its end: ``result`` (protobuf when ``result_proto``) or ``error`` with its
    ``category`` (``user`` | ``server``)."""

    __tablename__ = "primitive_requests"
    __table_args__ = (Index("ix_primitive_requests_model_status", "model_id", "status"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    model_id: Mapped[str] = mapped_column(ForeignKey("live_models.id"))
    sampler_id: Mapped[str | None] = mapped_column(String(120), nullable=True)
    seq: Mapped[int | None] = mapped_column(Integer, nullable=True)
    kind: Mapped[str] = mapped_column(String(40))
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    status: Mapped[str] = mapped_column(String(10), default="queued")  # queued | done | failed
    result: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    result_proto: Mapped[bool] = mapped_column(default=False)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    category: Mapped[str | None] = mapped_column(String(10), nullable=True)
    hold_id: Mapped[str | None] = mapped_column(String(40), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
