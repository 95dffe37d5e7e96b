"""evaluation failure cause

Failures recorded before this revision were not classified; they are marked ``platform`` (the run gets the
benefit of the doubt: such a failed submission no longer uses up a final submission).

Revision ID: 4ba83b7a5762
Revises: ede4aa0ec5bc
Create Date: 2026-11-30 13:27:56.987093
"""
import sqlalchemy as sa
from alembic import op

revision = '4ba83b7a5762'
down_revision = 'ede4aa0ec5bc'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('failure_cause', sa.String(length=20), nullable=True))
    op.execute("UPDATE evaluations SET failure_cause = 'platform' WHERE status = 'failed'")


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('failure_cause')
