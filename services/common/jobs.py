"""Leases for long work (training jobs, evaluations): claim, heartbeat, reconcile.

The database row is the job's truth; a queue message only says "work on job X". Every job table has the
columns of :class:`JobColumns`. The protocol:

- **claim**: a worker moves the row ``queued → running`` in one conditional update and writes its
  ``worker_id`` (``host:pid``) and ``heartbeat_at``; a duplicate message finds nothing to claim.
- **heartbeat**: while it works, a :class:`Lease` thread refreshes ``heartbeat_at`` every
  ``heartbeat_s`` seconds, but only while the row is still ``running`` under this worker's id. If the
  row moved on (the watchdog failed the job, or a reconciler gave it to another worker) the lease is
  *lost*: the worker stops and writes nothing more (fencing).
- **reconcile** (:func:`reconcile`, run periodically by the owning service and once when a worker starts):
  a ``running`` row whose worker is gone (its process is dead on this host, or its heartbeat is older
  than ``lease_s``) goes back to ``queued`` and is sent again, or fails after ``max_attempts``; a
  ``running`` row past its time limit fails (watchdog); a ``queued`` row whose message may have been lost
  (a broker restarted without persistence) is sent again after ``resend_after_s``, backing off. Sending a
  job twice is harmless: only one claim succeeds. A finished job whose hold is still not settled (the ledger
  was away when it ended) is settled again until it is (``hold_closed_at``).
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from sqlalchemy import Integer, String, func, select, update
from sqlalchemy.orm import Mapped, Session, mapped_column

from services.common.db import Database, UTCDateTime, utcnow
from services.common.processes import owner_alive


class JobColumns:
    """Mixin of the lease columns every job table carries (besides ``id``, ``status``, ``attempts``, ``started_at``)."""

    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    enqueued_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    resends: Mapped[int] = mapped_column(Integer, default=0)
    hold_closed_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)  # the job's ledger hold was settled


class JobRow(Protocol):
    id: Any
    status: Any
    attempts: Any
    started_at: Any
    worker_id: Any
    heartbeat_at: Any
    enqueued_at: Any
    resends: Any


def worker_id() -> str:
    """This process's identity as a job owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_gone(owner: str | None, heartbeat_at: dt.datetime | None, now: dt.datetime, lease_s: float) -> bool:
    """True when the worker ``owner`` (``host:pid``) no longer holds its lease.

    Its heartbeat is older than ``lease_s`` seconds, or it ran on this host and its process is gone
    (so a worker restarted on the same machine takes over at once instead of waiting out the lease).
    """
    if heartbeat_at is None or heartbeat_at < now - dt.timedelta(seconds=lease_s):
        return True
    return not owner_alive(owner or "")


def claim(db: Database, table: type, job_id: str) -> bool:
    """Move ``job_id`` from ``queued`` to ``running`` under this worker; False if it was not queued."""
    now = utcnow()
    with db.session() as s:
        return bool(s.execute(update(table).where(table.id == job_id, table.status == "queued").values(
            status="running", worker_id=worker_id(), heartbeat_at=now, attempts=table.attempts + 1,
            started_at=func.coalesce(table.started_at, now),
        )).rowcount)


def owned(table: type, job_id: str) -> Any:
    """The condition "``job_id`` is running under this worker" (for fenced updates)."""
    return (table.id == job_id) & (table.status == "running") & (table.worker_id == worker_id())


TERMINAL = ("succeeded", "failed", "cancelled")
SETTLE_GRACE_S = 30.0
_log = structlog.get_logger("jobs")


def owned_row(s: Session, table: type, job_id: str) -> Any:
    """``job_id``'s row, locked, if it is still running under this worker; ``None`` otherwise."""
    return s.scalar(select(table).where(owned(table, job_id)).with_for_update())


class LeaseLost(RuntimeError):
    """The job was taken from this worker (timed out, or given to another worker); stop writing."""


class Lease:
    """Heartbeats for a claimed job while the ``with`` block runs; :attr:`lost` is set if the row moved on."""

    def __init__(self, db: Database, table: type, job_id: str, heartbeat_s: float) -> None:
        self.db, self.table, self.job_id, self.heartbeat_s = db, table, job_id, heartbeat_s
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{job_id}", daemon=True)

    def start(self) -> Lease:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.heartbeat_s + 5)

    def __enter__(self) -> Lease:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def row(self, s: Session) -> Any:
        """The job's row, locked, for a fenced write; marks the lease lost and raises ``LeaseLost`` if it moved on."""
        row = owned_row(s, self.table, self.job_id)
        if row is None:
            self.lost.set()
        self.check()
        return row

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease is gone."""
        if self.lost.is_set():
            raise LeaseLost(f"{self.job_id} is no longer running under {worker_id()}")

    def beat(self) -> bool:
        """Refresh the heartbeat now; False (and :attr:`lost` set) if the row is no longer this worker's."""
        try:
            with self.db.session() as s:
                held = s.execute(update(self.table).where(owned(self.table, self.job_id)).values(heartbeat_at=utcnow())).rowcount
        except Exception:  # noqa: BLE001 - a database blip is not a lost lease; the next beat tries again
            return not self.lost.is_set()
        if not held:
            self.lost.set()
        return bool(held)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            if not self.beat():
                return


@dataclass
class ReconcileReport:
    """Ids acted on by one :func:`reconcile` round."""

    requeued: list[str] = field(default_factory=list)  # worker gone: back to queued, sent again
    resent: list[str] = field(default_factory=list)  # queued too long: message sent again
    timed_out: list[str] = field(default_factory=list)  # past the time limit: failed
    gave_up: list[str] = field(default_factory=list)  # worker lost max_attempts times: failed
    settled: list[str] = field(default_factory=list)  # finished earlier, hold settled now

    def __bool__(self) -> bool:
        return bool(self.requeued or self.resent or self.timed_out or self.gave_up or self.settled)


@dataclass(frozen=True)
class ReconcilePolicy:
    """Seconds and counts of :func:`reconcile` (see the module docstring)."""

    lease_s: float = 60.0
    time_limit_s: float = 24 * 3600.0
    max_attempts: int = 5
    resend_after_s: float = 120.0


def reconcile(
    db: Database,
    table: type,
    policy: ReconcilePolicy,
    *,
    send: Callable[[str], None],
    on_requeue: Callable[[Session, Any], None],
    on_fail: Callable[[Session, Any, str], None],
    after_fail: Callable[[str], None],
    now: dt.datetime | None = None,
) -> ReconcileReport:
    """One reconciliation round over ``table``.

    ``on_requeue(session, row)`` and ``on_fail(session, row, reason)`` run inside the transaction that
    changes the row (to record an event, set ``error``/``finished_at``); ``after_fail(id)`` settles the
    job's hold (after a failure here, and for finished jobs whose hold is still open; it must set
    ``hold_closed_at``); ``send(id)`` puts a message on the queue. Every change is a
    conditional update on the state that was read, so concurrent reconcilers (several service replicas, a
    starting worker) never act twice on one row.
    """
    now = now or utcnow()
    report = ReconcileReport()
    _take_back_running(db, table, policy, now, report, on_requeue=on_requeue, on_fail=on_fail)
    for job_id in report.timed_out + report.gave_up:
        after_fail(job_id)
    _resend_queued(db, table, policy, now, report)
    for job_id in report.requeued + report.resent:
        send(job_id)
    if hasattr(table, "hold_id"):  # a job that holds budget (a task's split build holds none)
        _settle_finished(db, table, now, report, after_fail)
    return report


def _take_back_running(db: Database, table: type, policy: ReconcilePolicy, now: dt.datetime, report: ReconcileReport, *,
                       on_requeue: Callable[[Session, Any], None], on_fail: Callable[[Session, Any, str], None]) -> None:
    """Running rows past the time limit fail (``report.timed_out``); those whose worker is gone are queued again
    (``report.requeued``) or, past ``max_attempts``, fail (``report.gave_up``). Each a conditional update on the owner read."""
    limit = now - dt.timedelta(seconds=policy.time_limit_s)
    with db.session() as s:
        running = s.execute(select(table.id, table.worker_id, table.heartbeat_at, table.started_at, table.attempts).where(table.status == "running")).all()
    for job_id, owner, heartbeat_at, started_at, attempts in running:
        if started_at is not None and started_at < limit:
            reason, bucket = f"timed out: running for more than {policy.time_limit_s:.0f} s", report.timed_out
        elif worker_gone(owner, heartbeat_at, now, policy.lease_s):
            if attempts < policy.max_attempts:
                with db.session() as s:
                    if s.execute(update(table).where(table.id == job_id, table.status == "running", table.worker_id == owner)
                                 .values(status="queued", worker_id=None, enqueued_at=now)).rowcount:
                        on_requeue(s, s.get(table, job_id))
                        report.requeued.append(job_id)
                continue
            reason, bucket = f"gave up: its worker was lost {attempts} times", report.gave_up
        else:
            continue
        with db.session() as s:
            if s.execute(update(table).where(table.id == job_id, table.status == "running", table.worker_id == owner)
                         .values(status="failed", worker_id=None)).rowcount:
                on_fail(s, s.get(table, job_id), reason)
                bucket.append(job_id)


def _resend_queued(db: Database, table: type, policy: ReconcilePolicy, now: dt.datetime, report: ReconcileReport) -> None:
    """Queued rows whose message may be lost (waiting longer than ``resend_after_s``, doubled per resend up to 32×) are
    marked resent (``report.resent``); ``resends`` doubles as a version number, so one reconciler wins."""
    with db.session() as s:
        queued = s.execute(select(table.id, table.enqueued_at, table.resends).where(table.status == "queued")).all()
    for job_id, enqueued_at, resends in queued:
        wait = dt.timedelta(seconds=policy.resend_after_s * 2 ** min(resends, 5))
        if enqueued_at is not None and enqueued_at > now - wait:
            continue
        with db.session() as s:
            if not s.execute(update(table).where(table.id == job_id, table.status == "queued", table.resends == resends)
                             .values(enqueued_at=now, resends=resends + 1)).rowcount:
                continue
        report.resent.append(job_id)


def _settle_finished(db: Database, table: type, now: dt.datetime, report: ReconcileReport, after_fail: Callable[[str], None]) -> None:
    """Rows finished a while ago (not racing the worker's own settle) whose hold is still open: ``after_fail`` settles
    each (``report.settled``); one the ledger cannot settle yet waits for the next round."""
    with db.session() as s:
        unsettled = s.scalars(select(table.id).where(table.status.in_(TERMINAL), table.hold_id.is_not(None), table.hold_closed_at.is_(None),
                                                     table.finished_at < now - dt.timedelta(seconds=SETTLE_GRACE_S))).all()
    for job_id in unsettled:
        try:
            after_fail(job_id)
            report.settled.append(job_id)
        except Exception:  # noqa: BLE001 - the ledger is still away; the next round tries again
            _log.warning("could not settle the hold of a finished job yet", job_id=job_id)
