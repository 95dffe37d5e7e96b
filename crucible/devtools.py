"""Migrations of every service (``crucible migrate``) and generating a new Alembic revision (``crucible dev revision``)."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config

from services.common.db import migrate

MIGRATIONS = {  # service -> (package holding the folder, folder name)
    "gateway": ("gateway", "migrations"),
    "ledger": ("services.ledger", "migrations"),
    "trainer": ("trainer_service", "migrations"),
    "inference": ("inference_service", "migrations"),
    "grader": ("grader", "migrations"),
    "teststore": ("grader", "teststore_migrations"),
}
SERVICES = tuple(MIGRATIONS)


def migrations_dir(service: str) -> Path:
    """The Alembic folder of ``service`` (one of :data:`SERVICES`), wherever the package is installed."""
    package, folder = MIGRATIONS[service]
    return Path(importlib.util.find_spec(package).origin).parent / folder  # type: ignore[union-attr, arg-type]


def database_url(service: str) -> str:
    """The URL ``service`` itself would use, from the same ``CRUCIBLE_*`` settings (the test store's from the grader's)."""
    if service == "teststore":
        from grader.settings import GraderSettings

        return GraderSettings(grader_test_seed=0).test_store_url()
    from services.common.settings import ServiceSettings

    return ServiceSettings().database_url_for(service)


def migrate_service(service: str, url: str | None = None) -> str:
    """Upgrade ``service``'s database (``url`` or its configured one) to the newest revision; returns the revision."""
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    url = url or database_url(service)
    migrate(url, migrations_dir(service))
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision() or "base"
    finally:
        engine.dispose()


def autogenerate(service: str, message: str, root: Path) -> None:
    """Write a new revision for ``service`` by diffing its models against a fresh SQLite database."""
    migrations = migrations_dir(service)
    template = migrations / "script.py.mako"
    shutil.copy(root / "services" / "common" / "script.py.mako", template)
    tmp = Path(tempfile.mkdtemp())
    try:
        url = f"sqlite:///{tmp / 'db.sqlite'}"
        migrate(url, migrations)
        cfg = Config()
        cfg.set_main_option("script_location", str(migrations))
        cfg.set_main_option("sqlalchemy.url", url)
        cfg.set_main_option("revision_environment", "true")
        command.revision(cfg, message=message, autogenerate=True)
    finally:
        shutil.rmtree(tmp)
        template.unlink()
