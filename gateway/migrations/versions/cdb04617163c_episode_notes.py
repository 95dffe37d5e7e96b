"""episode notes: the agent's notes in the episode log

Revision ID: cdb04617163c
Revises: 696f603543c0
Create Date: 2026-12-06 08:39:22.163709
"""
from alembic import op
import sqlalchemy as sa
from services.common.db import append_only_ddl, drop_append_only_ddl


revision = 'cdb04617163c'
down_revision = '696f603543c0'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # ALTER TABLE ADD COLUMN on both dialects: the table is not rebuilt, so its append-only triggers stay
    op.add_column('episode_log', sa.Column('note', sa.Text(), nullable=True))


def downgrade() -> None:
    # SQLite drops a column by rebuilding the table (batch mode), which loses its triggers: drop them first, add them back after
    dialect = op.get_bind().dialect.name
    for statement in drop_append_only_ddl(dialect, "episode_log"):
        op.execute(statement)
    with op.batch_alter_table('episode_log', schema=None) as batch_op:
        batch_op.drop_column('note')
    for statement in append_only_ddl(dialect, "episode_log"):
        op.execute(statement)
