"""audit log; append-only triggers

Revision ID: 35aba3d4b27a
Revises: f4c92d0bec8c
Create Date: 2026-11-30 01:57:20.434267
"""
from alembic import op
import sqlalchemy as sa
import services.common.db
from services.common.db import append_only_ddl, drop_append_only_ddl


revision = '35aba3d4b27a'
down_revision = 'f4c92d0bec8c'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('audit_log',
    sa.Column('seq', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('actor', sa.String(length=20), nullable=False),
    sa.Column('key_prefix', sa.String(length=16), nullable=True),
    sa.Column('method', sa.String(length=10), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('status', sa.Integer(), nullable=False),
    sa.Column('client', sa.String(length=64), nullable=True),
    sa.Column('created_at', services.common.db.UTCDateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('seq')
    )
    dialect = op.get_bind().dialect.name
    for table in ("audit_log", "episode_log"):
        for statement in append_only_ddl(dialect, table):
            op.execute(statement)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    for table in ("audit_log", "episode_log"):
        for statement in drop_append_only_ddl(dialect, table):
            op.execute(statement)
    op.drop_table('audit_log')
