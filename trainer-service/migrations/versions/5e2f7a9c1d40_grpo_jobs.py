"""grpo: a job's harness and run context, and its rollouts' prefill and decode tokens

Revision ID: 5e2f7a9c1d40
Revises: 38de61a44511
Create Date: 2026-12-01 12:10:00.000000
"""
from alembic import op
import sqlalchemy as sa


revision = '5e2f7a9c1d40'
down_revision = '38de61a44511'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('harness', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('run_context', sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column('prefill_tokens', sa.BigInteger(), nullable=False, server_default='0'))
        batch_op.add_column(sa.Column('decode_tokens', sa.BigInteger(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('training_jobs', schema=None) as batch_op:
        batch_op.drop_column('decode_tokens')
        batch_op.drop_column('prefill_tokens')
        batch_op.drop_column('run_context')
        batch_op.drop_column('harness')
