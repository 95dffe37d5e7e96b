"""Job leases and the reconciler (services.common.jobs) on a real database, SQLite and PostgreSQL.

The fault tests (tests/faults/test_faults.py) kill real workers; these pin down each rule of the protocol by itself.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
from collections.abc import Iterator

import pytest
from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from services.common import jobs
from services.common.db import Database, UTCDateTime, utcnow
from tests.conftest import throwaway_databases


class Base(DeclarativeBase):
    pass


class Job(jobs.JobColumns, Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    status: Mapped[str] = mapped_column(String(20))
    attempts: Mapped[int] = mapped_column(default=0)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    hold_id: Mapped[str | None] = mapped_column(nullable=True)
    error: Mapped[str | None] = mapped_column(nullable=True)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Database]:
    with throwaway_databases(["jobs"], request.param, tmp_path_factory.mktemp("jobs")) as urls:
        database = Database(urls["jobs"])
        Base.metadata.create_all(database.engine)
        try:
            yield database
        finally:
            database.engine.dispose()


@pytest.fixture
def clean(db: Database) -> Database:
    with db.session() as s:
        s.query(Job).delete()
    return db


def add(db: Database, job_id: str, **values: object) -> None:
    values.setdefault("status", "queued")
    values.setdefault("enqueued_at", utcnow())
    with db.session() as s:
        s.add(Job(id=job_id, **values))


def get(db: Database, job_id: str) -> Job:
    with db.session() as s:
        job = s.get(Job, job_id)
        s.expunge(job)
        return job


class Recorder:
    def __init__(self) -> None:
        self.sent: list[str] = []
        self.requeued: list[str] = []
        self.failed: dict[str, str] = {}
        self.after_fail: list[str] = []

    def run(self, db: Database, policy: jobs.ReconcilePolicy, now: dt.datetime | None = None) -> jobs.ReconcileReport:
        def on_fail(_s, job, reason):  # noqa: ANN001, ANN202
            job.error = reason
            self.failed[job.id] = reason

        return jobs.reconcile(db, Job, policy, send=self.sent.append, on_requeue=lambda _s, job: self.requeued.append(job.id),
                              on_fail=on_fail, after_fail=self.after_fail.append, now=now)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


POLICY = jobs.ReconcilePolicy(lease_s=30, time_limit_s=3600, max_attempts=3, resend_after_s=60)


def test_only_one_claim_of_a_queued_job_succeeds(clean: Database) -> None:
    add(clean, "j1")
    assert jobs.claim(clean, Job, "j1") is True
    assert jobs.claim(clean, Job, "j1") is False
    job = get(clean, "j1")
    assert (job.status, job.attempts, job.worker_id) == ("running", 1, jobs.worker_id())
    assert job.heartbeat_at is not None and job.started_at is not None


def test_a_live_worker_with_a_fresh_heartbeat_is_left_alone(clean: Database) -> None:
    add(clean, "j1")
    jobs.claim(clean, Job, "j1")
    rec = Recorder()
    assert not rec.run(clean, POLICY)
    assert get(clean, "j1").status == "running" and rec.sent == []


def test_a_dead_worker_on_this_host_is_replaced_at_once(clean: Database) -> None:
    add(clean, "j1", status="running", attempts=1, worker_id=f"{jobs.worker_id().rpartition(':')[0]}:{dead_pid()}",
        heartbeat_at=utcnow(), started_at=utcnow())
    rec = Recorder()
    report = rec.run(clean, POLICY)
    assert report.requeued == ["j1"] and rec.sent == ["j1"] and rec.requeued == ["j1"]
    job = get(clean, "j1")
    assert (job.status, job.worker_id) == ("queued", None)


def test_a_worker_elsewhere_is_gone_once_its_heartbeat_is_older_than_the_lease(clean: Database) -> None:
    now = utcnow()
    add(clean, "j1", status="running", attempts=1, worker_id="other-host:1", heartbeat_at=now - dt.timedelta(seconds=29), started_at=now)
    rec = Recorder()
    assert not rec.run(clean, POLICY, now=now)
    report = rec.run(clean, POLICY, now=now + dt.timedelta(seconds=2))
    assert report.requeued == ["j1"] and get(clean, "j1").status == "queued"


def test_a_job_past_its_time_limit_fails_and_its_hold_is_closed(clean: Database) -> None:
    now = utcnow()
    add(clean, "j1", status="running", attempts=1, worker_id=jobs.worker_id(), heartbeat_at=now, started_at=now - dt.timedelta(hours=2))
    rec = Recorder()
    report = rec.run(clean, POLICY, now=now)
    assert report.timed_out == ["j1"] and rec.after_fail == ["j1"]
    job = get(clean, "j1")
    assert job.status == "failed" and "timed out" in job.error


def test_a_job_that_keeps_losing_its_worker_fails_after_max_attempts(clean: Database) -> None:
    now = utcnow()
    add(clean, "j1", status="running", attempts=3, worker_id="other-host:1", heartbeat_at=now - dt.timedelta(minutes=5), started_at=now)
    rec = Recorder()
    report = rec.run(clean, POLICY, now=now)
    assert report.gave_up == ["j1"] and rec.sent == [] and rec.after_fail == ["j1"]
    assert get(clean, "j1").status == "failed"


def test_a_queued_job_whose_message_may_be_lost_is_sent_again_with_backoff(clean: Database) -> None:
    t0 = utcnow()
    add(clean, "j1", enqueued_at=t0)
    rec = Recorder()
    assert not rec.run(clean, POLICY, now=t0 + dt.timedelta(seconds=59))
    assert rec.run(clean, POLICY, now=t0 + dt.timedelta(seconds=61)).resent == ["j1"]
    t1 = get(clean, "j1").enqueued_at
    assert not rec.run(clean, POLICY, now=t1 + dt.timedelta(seconds=100))  # second wait: 120 s
    assert rec.run(clean, POLICY, now=t1 + dt.timedelta(seconds=121)).resent == ["j1"]
    assert rec.sent == ["j1", "j1"] and get(clean, "j1").resends == 2


def test_two_reconcilers_at_once_act_on_a_job_once(clean: Database) -> None:
    now = utcnow()
    add(clean, "j1", status="running", attempts=1, worker_id="other-host:1", heartbeat_at=now - dt.timedelta(minutes=5), started_at=now)
    a, b = Recorder(), Recorder()
    a.run(clean, POLICY, now=now)
    b.run(clean, POLICY, now=now)
    assert a.sent + b.sent == ["j1"]


def test_a_lease_is_lost_when_the_row_moves_on(clean: Database) -> None:
    add(clean, "j1")
    jobs.claim(clean, Job, "j1")
    lease = jobs.Lease(clean, Job, "j1", heartbeat_s=0.05)
    assert lease.beat() and not lease.lost.is_set()
    lease.check()
    with clean.session() as s:  # the watchdog failed it
        s.get(Job, "j1").status = "failed"
    assert lease.beat() is False and lease.lost.is_set()
    with pytest.raises(jobs.LeaseLost):
        lease.check()


def test_a_finished_job_whose_hold_could_not_be_settled_is_settled_later(clean: Database) -> None:
    now = utcnow()
    add(clean, "j1", status="succeeded", hold_id="hold_1", finished_at=now - dt.timedelta(minutes=2))
    add(clean, "j2", status="succeeded", hold_id="hold_2", finished_at=now - dt.timedelta(minutes=2), hold_closed_at=now)
    add(clean, "j3", status="failed", hold_id="hold_3", finished_at=now)  # just finished: its worker is settling it
    rec = Recorder()
    assert rec.run(clean, POLICY, now=now).settled == ["j1"] and rec.after_fail == ["j1"]
