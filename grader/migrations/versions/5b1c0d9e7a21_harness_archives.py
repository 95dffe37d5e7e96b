"""harness archives: code harnesses (a run's uploads, a suite's own); evaluations and submissions may name one; a
validation trajectory keeps a code harness's rollout

Revision ID: 5b1c0d9e7a21
Revises: 4de6b00d3c57
Create Date: 2026-12-01 04:30:00.000000
"""
import sqlalchemy as sa
from alembic import op

from services.common.db import UTCDateTime

revision = '5b1c0d9e7a21'
down_revision = '4de6b00d3c57'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'harness_archives',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('bytes', sa.Integer(), nullable=False),
        sa.Column('uri', sa.Text(), nullable=False),
        sa.Column('manifest', sa.JSON(), nullable=False),
        sa.Column('created_at', UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('run_id', 'sha256'),
    )
    op.create_index(op.f('ix_harness_archives_run_id'), 'harness_archives', ['run_id'], unique=False)
    for table in ('evaluations', 'submissions'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('harness_archive', sa.String(length=40), nullable=True))
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rollout', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.drop_column('rollout')
    for table in ('evaluations', 'submissions'):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column('harness_archive')
    op.drop_index(op.f('ix_harness_archives_run_id'), table_name='harness_archives')
    op.drop_table('harness_archives')
