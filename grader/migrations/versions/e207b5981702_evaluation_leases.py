"""evaluation leases

Revision ID: e207b5981702
Revises: d475d4b71565
Create Date: 2026-11-30 01:22:51.337429
"""
from alembic import op
import sqlalchemy as sa
import services.common.db

revision = 'e207b5981702'
down_revision = 'd475d4b71565'
branch_labels = None
depends_on = None

def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('worker_id', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('heartbeat_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('enqueued_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column('resends', sa.Integer(), nullable=False, server_default='0'))

def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('resends')
        batch_op.drop_column('enqueued_at')
        batch_op.drop_column('heartbeat_at')
        batch_op.drop_column('worker_id')

