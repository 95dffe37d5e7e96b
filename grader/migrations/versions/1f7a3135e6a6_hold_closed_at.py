"""hold_closed_at: when the job's ledger hold was settled (the reconciler settles the ones still open)

Revision ID: 1f7a3135e6a6
Revises: e207b5981702
Create Date: 2026-11-30 03:18:22.100860
"""
from alembic import op
import sqlalchemy as sa
import services.common.db

revision = '1f7a3135e6a6'
down_revision = 'e207b5981702'
branch_labels = None
depends_on = None

def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hold_closed_at', services.common.db.UTCDateTime(timezone=True), nullable=True))

def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('hold_closed_at')

