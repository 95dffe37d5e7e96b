"""trajectory score_error: why the suite's scorer could not score the answer (the score is then 0)

Revision ID: 8165a11feef4
Revises: 4ba83b7a5762
Create Date: 2026-11-30 15:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '8165a11feef4'
down_revision = '4ba83b7a5762'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.add_column(sa.Column('score_error', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.drop_column('score_error')
