"""a grpo job's grader spec

Revision ID: 3b7e41c2a9d5
Revises: 5e2f7a9c1d40
Create Date: 2026-12-06 12:40:00.000000
"""
from alembic import op
import sqlalchemy as sa

revision = '3b7e41c2a9d5'
down_revision = '5e2f7a9c1d40'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('grader', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.drop_column('grader')
