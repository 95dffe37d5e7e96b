"""job leases and idempotency keys

Revision ID: d077c01a9724
Revises: f245ea7d8efa
Create Date: 2026-11-30 01:24:34.125116
"""
from alembic import op
import sqlalchemy as sa
import services.common.db

revision = 'd077c01a9724'
down_revision = 'f245ea7d8efa'
branch_labels = None
depends_on = None

def upgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('idempotency_key', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('request_sha256', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('worker_id', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('enqueued_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('resends', sa.Integer(), nullable=False, server_default='0'))
        batch_op.create_unique_constraint('uq_training_jobs_run_idempotency_key', ['run_id', 'idempotency_key'])


def downgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.drop_constraint('uq_training_jobs_run_idempotency_key', type_='unique')
        batch_op.drop_column('resends')
        batch_op.drop_column('enqueued_at')
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('worker_id')
        batch_op.drop_column('request_sha256')
        batch_op.drop_column('idempotency_key')

