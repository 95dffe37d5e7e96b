"""task split builds: a grading task's splits are built by a leased job (status, attempts, error, the operator's warnings
and the lease columns);
the tasks registered before were built when registered, so they are ``succeeded``

Revision ID: a7c3e9f1d2b5
Revises: f3a9c1d2b7e4
Create Date: 2026-12-07 19:20:00
"""
import sqlalchemy as sa
from alembic import op

import services.common.db

revision = 'a7c3e9f1d2b5'
down_revision = 'f3a9c1d2b7e4'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('grading_tasks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('status', sa.String(length=20), nullable=False, server_default='succeeded'))
        batch_op.add_column(sa.Column('attempts', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('error', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('warnings', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('started_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('finished_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('worker_id', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('enqueued_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('resends', sa.Integer(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('hold_closed_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
    op.create_index('ix_grading_tasks_status', 'grading_tasks', ['status'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_grading_tasks_status', table_name='grading_tasks')
    with op.batch_alter_table('grading_tasks', schema=None) as batch_op:
        for column in ('hold_closed_at', 'resends', 'enqueued_at', 'heartbeat_at', 'worker_id', 'finished_at', 'started_at', 'warnings', 'error', 'attempts', 'status'):
            batch_op.drop_column(column)
