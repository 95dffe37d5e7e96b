"""benchmark candidate key: the evaluator track's key of its candidates' names, kept with the benchmark

Revision ID: 9b2e4c6d8f10
Revises: 8a1f0c3d5e27
Create Date: 2026-12-07 01:40:00
"""
from alembic import op
import sqlalchemy as sa


revision = '9b2e4c6d8f10'
down_revision = '8a1f0c3d5e27'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('benchmarks', schema=None) as batch_op:
        batch_op.add_column(sa.Column('candidate_key', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('benchmarks', schema=None) as batch_op:
        batch_op.drop_column('candidate_key')
