"""hold_closed_at: when the job's ledger hold was settled (the reconciler settles the ones still open)

Revision ID: 8bc848c9ce94
Revises: d077c01a9724
Create Date: 2026-11-30 03:18:19.907304
"""
from alembic import op
import sqlalchemy as sa
import services.common.db

revision = '8bc848c9ce94'
down_revision = 'd077c01a9724'
branch_labels = None
depends_on = None

def upgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hold_closed_at', services.common.db.UTCDateTime(timezone=True), nullable=True))

def downgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.drop_column('hold_closed_at')

