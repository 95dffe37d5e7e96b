"""evaluator track: a target's grading of one candidate (candidate), an evaluator's grade (grade)

Revision ID: c5d0e1f2a3b4
Revises: ac33503e5ecc
Create Date: 2026-12-07 00:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = 'c5d0e1f2a3b4'
down_revision = 'ac33503e5ecc'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('candidate', sa.String(length=20), nullable=True))
        batch_op.add_column(sa.Column('grade', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('grade')
        batch_op.drop_column('candidate')
