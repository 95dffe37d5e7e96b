"""Every service's Alembic migrations, on SQLite and on PostgreSQL: they build exactly what the ORM models
declare (a model change without its revision fails here), and they downgrade to nothing and back."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, create_engine, inspect

from crucible.devtools import SERVICES, migrate_service, migrations_dir
from tests.conftest import throwaway_databases

METADATA = {  # service -> (module, declarative base)
    "gateway": ("gateway.models", "Base"),
    "ledger": ("services.ledger.models", "LedgerBase"),
    "trainer": ("trainer_service.models", "Base"),
    "inference": ("inference_service.models", "Base"),
    "grader": ("grader.models", "Base"),
    "teststore": ("grader.teststore", "TestBase"),
}


def metadata(service: str) -> MetaData:
    module, base = METADATA[service]
    return getattr(importlib.import_module(module), base).metadata


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_db(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # noqa: ANN001
    with throwaway_databases(["migrations"], request.param, tmp_path) as urls:
        yield urls["migrations"]


def test_every_service_has_its_metadata_listed() -> None:
    assert set(METADATA) == set(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
def test_migrations_build_what_the_models_declare_and_round_trip(service: str, empty_db: str) -> None:
    revision = migrate_service(service, empty_db)
    engine = create_engine(empty_db)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata(service))
        assert diff == [], f"{service}: the models differ from the migrations; run `crucible dev revision {service} ...`:\n{diff}"

        cfg = Config()
        cfg.set_main_option("script_location", str(migrations_dir(service)))
        cfg.set_main_option("sqlalchemy.url", empty_db)
        command.downgrade(cfg, "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        engine.dispose()
        assert migrate_service(service, empty_db) == revision
    finally:
        engine.dispose()


def test_crucible_migrate_reports_a_bad_or_unreachable_database_url_without_a_traceback(tmp_path) -> None:  # noqa: ANN001
    from typer.testing import CliRunner

    from crucible.cli import app

    runner = CliRunner()
    bad = runner.invoke(app, ["migrate", "--service", "ledger", "--url", "not-a-url"])
    assert bad.exit_code == 2 and "not a database URL" in bad.output and "Traceback" not in bad.output
    down = runner.invoke(app, ["migrate", "--service", "ledger", "--url", "postgresql+psycopg://nobody@127.0.0.1:1/none"])
    assert down.exit_code == 1 and "cannot reach its database" in down.output
    ok = runner.invoke(app, ["migrate", "--service", "ledger", "--url", f"sqlite:///{tmp_path / 'l.sqlite'}"])
    assert ok.exit_code == 0 and "ledger: at revision" in ok.output, ok.output
    two = runner.invoke(app, ["migrate", "--service", "ledger", "--service", "trainer", "--url", f"sqlite:///{tmp_path / 'x.sqlite'}"])
    assert two.exit_code == 2 and "belongs to one service" in two.output


def _migrate_in_a_process(service: str, url: str, start) -> str:  # noqa: ANN001 - a multiprocessing.Event
    start.wait(30)
    return migrate_service(service, url)


@pytest.fixture(scope="module")
def processes() -> Iterator[tuple[Any, Any]]:
    """Four spawned processes (a pool) and a manager for their start event, shared by the module's cases: spawning them
    (each imports the services) is most of a case's time, and each case releases its four migrations together."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(4) as pool:
        yield pool, manager


@pytest.mark.parametrize("service", ["teststore", "grader"])
def test_processes_starting_together_migrate_one_database_once(service: str, empty_db: str, processes: tuple[Any, Any]) -> None:
    """A service's API and its workers start at once and each migrates the databases it opens (the grader,
    its eval worker and its grading worker all open the test store): four processes released together all
    end at head, none fails with "table already exists" (CI saw exactly that on the embedded stack)."""
    pool, manager = processes
    start = manager.Event()
    pending = [pool.apply_async(_migrate_in_a_process, (service, empty_db, start)) for _ in range(4)]
    start.set()
    revisions = {p.get(timeout=120) for p in pending}
    assert len(revisions) == 1 and revisions != {"base"}
