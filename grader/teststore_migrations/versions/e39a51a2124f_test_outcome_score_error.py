"""test outcome score_error: why the suite's scorer could not score the answer (the score is then 0)

Revision ID: e39a51a2124f
Revises: 741f20c4bd55
Create Date: 2026-11-30 15:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = 'e39a51a2124f'
down_revision = '741f20c4bd55'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('test_outcomes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('score_error', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('test_outcomes', schema=None) as batch_op:
        batch_op.drop_column('score_error')
