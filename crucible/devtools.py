"""Developer commands: generating a service's Alembic revision from its ORM models."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from alembic import command
from alembic.config import Config

from services.common.db import migrate

MIGRATION_DIRS = {
    "gateway": "gateway/migrations",
    "ledger": "services/ledger/migrations",
    "trainer": "trainer-service/migrations",
    "inference": "inference-service/migrations",
    "grader": "grader/migrations",
    "teststore": "grader/teststore_migrations",
}


def autogenerate(service: str, message: str, root: Path) -> None:
    """Write a new revision for ``service`` by diffing its models against a fresh SQLite database."""
    migrations = root / MIGRATION_DIRS[service]
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
