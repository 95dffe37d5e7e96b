"""Database engines and sessions (SQLAlchemy 2), the same code on SQLite (embedded) and PostgreSQL.

Each service owns one database. On SQLite every write transaction starts with ``BEGIN IMMEDIATE`` so
concurrent writers serialize instead of failing mid-transaction, and WAL mode lets readers proceed.
Schemas are created by each service's Alembic migrations (:func:`migrate`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import DateTime, Engine, create_engine, event, make_url, text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool
from sqlalchemy.types import TypeDecorator


def utcnow() -> dt.datetime:
    """Current time, timezone-aware UTC."""
    return dt.datetime.now(dt.UTC)


class UTCDateTime(TypeDecorator):
    """A timestamp stored as UTC and always returned timezone-aware (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):  # noqa: ANN001, ANN201 - SQLAlchemy hook
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return value.astimezone(dt.UTC) if value is not None else None

    def process_result_value(self, value, dialect):  # noqa: ANN001, ANN201 - SQLAlchemy hook
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=dt.UTC)
        return value


def make_engine(url: str) -> Engine:
    """Create an engine; on SQLite enables WAL, a 30 s busy timeout and ``BEGIN IMMEDIATE`` transactions."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):  # noqa: ANN001
            dbapi_conn.isolation_level = None  # let SQLAlchemy's begin event emit BEGIN itself
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):  # noqa: ANN001
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)  # ≤ 15 connections per process: many processes share one server


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or dropped the connection (a restart, a failover): worth
    retrying later, unlike a refused statement. SQLAlchemy's ``OperationalError``/``InterfaceError`` (a connection that
    failed or broke) and any DBAPI error it flagged ``connection_invalidated``."""
    return isinstance(exc, OperationalError | InterfaceError) or (isinstance(exc, DBAPIError) and exc.connection_invalidated)


def append_only_ddl(dialect: str, table: str) -> list[str]:
    """SQL that makes ``table`` append-only in the database itself: UPDATE and DELETE raise an error.

    For migrations (``op.execute`` each statement); PostgreSQL and SQLite triggers.
    """
    if dialect == "postgresql":
        return [
            "CREATE OR REPLACE FUNCTION crucible_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ "
            "BEGIN RAISE EXCEPTION '% is append-only', TG_TABLE_NAME; END $$",
            f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} FOR EACH ROW EXECUTE FUNCTION crucible_append_only()",
        ]
    return [
        f"CREATE TRIGGER {table}_no_update BEFORE UPDATE ON {table} BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END",
        f"CREATE TRIGGER {table}_no_delete BEFORE DELETE ON {table} BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END",
    ]


def drop_append_only_ddl(dialect: str, table: str) -> list[str]:
    """The reverse of :func:`append_only_ddl` (for downgrades)."""
    if dialect == "postgresql":
        return [f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}"]
    return [f"DROP TRIGGER IF EXISTS {table}_no_update", f"DROP TRIGGER IF EXISTS {table}_no_delete"]


def serialize(s: Session, key: str) -> None:
    """Serialize transactions on ``key`` until this one ends (check-then-insert without a row to lock).

    PostgreSQL: a transaction-level advisory lock on a 63-bit hash of ``key``. SQLite: nothing to do, every
    write transaction is ``BEGIN IMMEDIATE`` and so already runs alone.
    """
    if s.get_bind().dialect.name == "postgresql":
        digest = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") & (2**63 - 1)
        s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": digest})


class Database:
    """An engine plus a session factory for one service."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        """A session in one transaction: committed on success, rolled back on any exception."""
        with self.sessions() as session, session.begin():
            yield session

    def unready(self) -> str | None:
        """``None`` if the database answers ``SELECT 1`` now, else why not (readiness: ``GET /readyz``)."""
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:  # noqa: BLE001 - any failure means not ready; the reason is reported
            return f"database: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
        return None


_MIGRATE_LOCK = threading.Lock()


def migrate(url: str, migrations_dir: Path) -> None:
    """Upgrade the database at ``url`` to the newest revision of the Alembic scripts in ``migrations_dir``.

    Serialized within the process (Alembic's command context is process-global) and across processes: a
    service's API and its workers start together and each migrates the databases it opens, and of
    two ``CREATE TABLE`` statements racing, the second fails ("table already exists"). The cross-process lock is an
    ``flock`` on ``<database file>.migrate.lock`` for SQLite and a session-level advisory lock for PostgreSQL,
    held for the whole upgrade; whoever waited finds the schema at head and does nothing.
    """
    with _MIGRATE_LOCK, _across_processes(url, migrations_dir):
        _upgrade(url, migrations_dir)


@contextlib.contextmanager
def _across_processes(url: str, migrations_dir: Path) -> Iterator[None]:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        lock_path = Path(parsed.database + ".migrate.lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    if parsed.get_backend_name() == "postgresql":
        engine = create_engine(url, poolclass=NullPool)
        key = int.from_bytes(hashlib.sha256(f"crucible-migrate:{migrations_dir.name}".encode()).digest()[:8], "big") & (2**63 - 1)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
                conn.commit()
                try:
                    yield
                finally:
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                    conn.commit()
        finally:
            engine.dispose()
        return
    yield


def _upgrade(url: str, migrations_dir: Path) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    command.upgrade(cfg, "head")
