"""entries append-only trigger: the database itself refuses UPDATE and DELETE of ledger entries

Revision ID: ccaf57a0f1e8
Revises: 4cc489f2e304
Create Date: 2026-11-30 01:57:24.485307
"""
from alembic import op
import sqlalchemy as sa
from services.common.db import append_only_ddl, drop_append_only_ddl


revision = 'ccaf57a0f1e8'
down_revision = '4cc489f2e304'
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in append_only_ddl(op.get_bind().dialect.name, "entries"):
        op.execute(statement)


def downgrade() -> None:
    for statement in drop_append_only_ddl(op.get_bind().dialect.name, "entries"):
        op.execute(statement)
