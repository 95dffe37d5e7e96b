"""null-model ablation: an evaluation's ablation, a submission's ablation grading

Revision ID: f3a9c1d2b7e4
Revises: d8e2f4a6b1c3
Create Date: 2026-12-07 19:10:00
"""
from alembic import op
import sqlalchemy as sa


revision = 'f3a9c1d2b7e4'
down_revision = 'd8e2f4a6b1c3'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ablation', sa.String(length=20), nullable=True))
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ablation_evaluation_id', sa.String(length=40), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('submissions', schema=None) as batch_op:
        batch_op.drop_column('ablation_evaluation_id')
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('ablation')
