"""Alembic environment of the ledger: its own tables only (``services.ledger.models``)."""

from services.common.migrations_env import run_migrations
from services.ledger.models import LedgerBase

run_migrations(LedgerBase.metadata)
