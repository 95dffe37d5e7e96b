"""Queries of the gateway's database: benchmarks, runs (found by id or by their key's hash), and the append-only
episode and audit logs. Each takes the caller's session; the rules (who may call, what a run may do) are in
``service``, ``runs``, ``benchmarks`` and ``leaderboard``."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from gateway.models import AuditEvent, Benchmark, EpisodeEvent, FineTuningJob, Run
from services.common.db import utcnow
from services.common.errors import NotFound
from services.common.ids import has_prefix

# --------------------------------------------------------------------------- benchmarks


def benchmark(s: Session, benchmark_id: str) -> Benchmark | None:
    """Benchmark ``benchmark_id``'s row; ``None`` if unknown."""
    return s.get(Benchmark, benchmark_id)


def benchmark_by_name(s: Session, name: str) -> Benchmark | None:
    """The benchmark named ``name``, if one is loaded."""
    return s.scalar(select(Benchmark).where(Benchmark.name == name))


def find_benchmark(s: Session, ref: str) -> Benchmark:
    """The benchmark with id or name ``ref``; ``NotFound`` (field ``benchmark``) if there is none."""
    b = benchmark(s, ref) if has_prefix(ref, "bm") else benchmark_by_name(s, ref)
    if b is None:
        raise NotFound(f"benchmark {ref!r} not found", field="benchmark")
    return b


def benchmarks(s: Session) -> list[Benchmark]:
    """Every benchmark, oldest first."""
    return list(s.scalars(select(Benchmark).order_by(Benchmark.id)))


def delete_benchmark(s: Session, benchmark_id: str) -> None:
    """Delete benchmark ``benchmark_id``'s row, if it is there and no run is on it."""
    s.execute(delete(Benchmark).where(Benchmark.id == benchmark_id, ~select(Run.id).where(Run.benchmark_id == benchmark_id).exists()))


def add_benchmark(s: Session, benchmark_id: str, name: str, spec: dict[str, Any], tasks: dict[str, str], candidate_key: str | None = None) -> Benchmark:
    """Add a benchmark (``spec``: its validated document; ``tasks``: task name → the grader's id; ``candidate_key``: the
    evaluator track's key of its candidates' names), flushed; returns its row. A second of the same name violates the
    unique name (``IntegrityError``, at the flush)."""
    b = Benchmark(id=benchmark_id, name=name, spec=spec, tasks=tasks, candidate_key=candidate_key, created_at=utcnow())
    s.add(b)
    s.flush()
    return b


# --------------------------------------------------------------------------- runs


def run(s: Session, run_id: str, *, field: str | None = None) -> Run:
    """Run ``run_id``'s row; ``NotFound`` (naming ``field``, if given) for an unknown id."""
    r = s.get(Run, run_id)
    if r is None:
        raise NotFound(f"run {run_id} not found", field=field)
    return r


def run_by_key_hash(s: Session, key_hash: str) -> Run | None:
    """The run whose API key hashes to ``key_hash`` (revoked or not), if any."""
    return s.scalar(select(Run).where(Run.key_hash == key_hash))


def runs(s: Session) -> list[Run]:
    """Every run, oldest first."""
    return list(s.scalars(select(Run).order_by(Run.id)))


def add_run(s: Session, run_id: str, *, benchmark_id: str, agent_name: str, track: str, key_hash: str, key_prefix: str, budget_usd_micros: int,
            deadline_at: dt.datetime, created_at: dt.datetime) -> Run:
    """Add a run of benchmark ``benchmark_id`` (only its key's hash and first characters stored), flushed; returns its row."""
    r = Run(id=run_id, benchmark_id=benchmark_id, agent_name=agent_name, track=track, key_hash=key_hash, key_prefix=key_prefix,
            budget_usd_micros=budget_usd_micros, deadline_at=deadline_at, created_at=created_at)
    s.add(r)
    s.flush()
    return r


# --------------------------------------------------------------------------- episode and audit logs


def add_episode_event(s: Session, run_id: str, method: str, path: str, status: int, latency_ms: int, note: str | None = None) -> EpisodeEvent:
    """Append one of run ``run_id``'s calls (or, with ``note``, one of its agent's notes) to the episode log, flushed; returns its row."""
    e = EpisodeEvent(run_id=run_id, method=method, path=path, status=status, latency_ms=latency_ms, note=note, created_at=utcnow())
    s.add(e)
    s.flush()
    return e


def episode_events_after(s: Session, run_id: str, after: int, limit: int) -> list[EpisodeEvent]:
    """At most ``limit`` of run ``run_id``'s calls with ``seq > after``, oldest first."""
    return list(s.scalars(select(EpisodeEvent).where(EpisodeEvent.run_id == run_id, EpisodeEvent.seq > after).order_by(EpisodeEvent.seq).limit(limit)))


def add_audit_event(s: Session, actor: str, key_prefix: str | None, method: str, path: str, status: int, client: str | None) -> None:
    """Append an operator action or a refused credential to the audit log."""
    s.add(AuditEvent(actor=actor, key_prefix=key_prefix, method=method, path=path, status=status, client=client, created_at=utcnow()))


def audit_events_after(s: Session, after: int, limit: int) -> list[AuditEvent]:
    """At most ``limit`` audit events with ``seq > after``, oldest first."""
    return list(s.scalars(select(AuditEvent).where(AuditEvent.seq > after).order_by(AuditEvent.seq).limit(limit)))


def episode_summary(s: Session, run_id: str) -> tuple[int, dt.datetime | None]:
    """How many calls run ``run_id``'s agent made, and when the last one came (``None``: none)."""
    count, last = s.execute(select(func.count(), func.max(EpisodeEvent.created_at)).where(EpisodeEvent.run_id == run_id)).one()
    return int(count), last


# --------------------------------------------------------------------------- OpenAI fine-tuning jobs


def add_fine_tuning_job(s: Session, record: FineTuningJob) -> FineTuningJob:
    """Store ``record`` unless its job has one already (a create repeated with the same idempotency key); returns the stored row."""
    existing = s.get(FineTuningJob, record.job_id)
    if existing is not None:
        return existing
    s.add(record)
    s.flush()
    return record


def fine_tuning_job(s: Session, run_id: str, job_id: str) -> FineTuningJob | None:
    """Run ``run_id``'s fine-tuning job ``job_id``; ``None`` if it is another run's or was not created through the fine-tuning API."""
    record = s.get(FineTuningJob, job_id)
    return record if record is not None and record.run_id == run_id else None


def fine_tuning_jobs(s: Session, run_id: str) -> list[FineTuningJob]:
    """The run's fine-tuning jobs, newest first."""
    return list(s.scalars(select(FineTuningJob).where(FineTuningJob.run_id == run_id)
                          .order_by(FineTuningJob.created_at.desc(), FineTuningJob.job_id.desc())))


def recent_fine_tuning_job(s: Session, run_id: str, request_sha256: str, since: dt.datetime) -> FineTuningJob | None:
    """The run's newest fine-tuning job created since ``since`` from a request whose hash is ``request_sha256``."""
    return s.scalar(select(FineTuningJob).where(FineTuningJob.run_id == run_id, FineTuningJob.request_sha256 == request_sha256,
                                                FineTuningJob.created_at >= since).order_by(FineTuningJob.created_at.desc()).limit(1))
