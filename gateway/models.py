"""ORM tables of the gateway: benchmarks, runs (with hashed keys) and the episode log."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common.db import UTCDateTime, utcnow


class Base(DeclarativeBase):
    pass


class Benchmark(Base):
    """A benchmark loaded from a YAML file (the validated document is kept whole)."""

    __tablename__ = "benchmarks"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    tasks: Mapped[dict[str, str] | None] = mapped_column(JSON, nullable=True)  # task name -> the grader's benchmark id of that task
    # the evaluator track: the key its candidates were named under when it was loaded (services.common.candidates.assign),
    # kept with it so that a later change of CRUCIBLE_CANDIDATE_KEY renames nothing its targets graded
    candidate_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)

    def task_ids(self) -> dict[str, str]:
        """Task name → the grader's id for it (a one-task benchmark is graded under its own id)."""
        return self.tasks or {"main": self.id}


class Run(Base):
    """One research agent's attempt at one benchmark. The API key is stored only as its SHA-256."""

    __tablename__ = "runs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    benchmark_id: Mapped[str] = mapped_column(ForeignKey("benchmarks.id"), index=True)
    agent_name: Mapped[str] = mapped_column(String(200))
    track: Mapped[str] = mapped_column(String(20))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_prefix: Mapped[str] = mapped_column(String(16))
    budget_usd_micros: Mapped[int] = mapped_column(BigInteger)
    deadline_at: Mapped[dt.datetime] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class EpisodeEvent(Base):
    """One agent call: the episode log records every request a run's key made (append-only, by trigger), and the notes
    the agent wrote (``POST /v1/run/notes``): a row with method ``NOTE`` and the text in ``note``, besides the call's own row."""

    __tablename__ = "episode_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    method: Mapped[str] = mapped_column(String(10))
    path: Mapped[str] = mapped_column(Text)
    status: Mapped[int] = mapped_column(Integer)
    latency_ms: Mapped[int] = mapped_column(Integer)
    note: Mapped[str | None] = mapped_column(Text, nullable=True)  # a NOTE row's text; null for a call
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class AuditEvent(Base):
    """An operator action or a refused credential, append-only (a database trigger refuses UPDATE and DELETE).

    ``actor``: ``admin`` (the admin key), or ``anonymous`` (a missing, unknown or revoked key; ``key_prefix``
    holds the first 8 characters of what was sent, never the key). Uses of run keys are in the episode log.
    """

    __tablename__ = "audit_log"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    actor: Mapped[str] = mapped_column(String(20))
    key_prefix: Mapped[str | None] = mapped_column(String(16), nullable=True)
    method: Mapped[str] = mapped_column(String(10))
    path: Mapped[str] = mapped_column(Text)
    status: Mapped[int] = mapped_column(Integer)
    client: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class FineTuningJob(Base):
    """What OpenAI's fine-tuning API says of a training job created through it (``/v1/fine_tuning/jobs``) that the
    trainer's job does not hold: the request as sent (for the echo and to recognize the SDK's retry of it), the values
    its ``"auto"`` hyper-parameters resolved to, ``suffix``, ``metadata`` and ``seed``. The job itself is the trainer's."""

    __tablename__ = "fine_tuning_jobs"

    job_id: Mapped[str] = mapped_column(String(40), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(40), index=True)
    training_file: Mapped[str] = mapped_column(String(40))
    method: Mapped[dict[str, Any]] = mapped_column(JSON)  # the method as sent, "auto" kept
    resolved: Mapped[dict[str, Any]] = mapped_column(JSON)  # each hyper-parameter's value in the job
    suffix: Mapped[str | None] = mapped_column(String(64), nullable=True)
    job_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSON, nullable=True)
    seed: Mapped[int] = mapped_column(BigInteger)
    request_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
