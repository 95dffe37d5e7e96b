"""fine_tuning_jobs: what OpenAI's fine-tuning API says of a job beside the trainer's record

Revision ID: 8a1f0c3d5e27
Revises: cdb04617163c
Create Date: 2026-12-06 12:50:00.000000
"""
from alembic import op
import sqlalchemy as sa
import services.common.db

revision = '8a1f0c3d5e27'
down_revision = 'cdb04617163c'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'fine_tuning_jobs',
        sa.Column('job_id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('training_file', sa.String(length=40), nullable=False),
        sa.Column('method', sa.JSON(), nullable=False),
        sa.Column('resolved', sa.JSON(), nullable=False),
        sa.Column('suffix', sa.String(length=64), nullable=True),
        sa.Column('metadata', sa.JSON(), nullable=True),
        sa.Column('seed', sa.BigInteger(), nullable=False),
        sa.Column('request_sha256', sa.String(length=64), nullable=False),
        sa.Column('created_at', services.common.db.UTCDateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('job_id'),
    )
    with op.batch_alter_table('fine_tuning_jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_fine_tuning_jobs_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('fine_tuning_jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_fine_tuning_jobs_run_id'))
    op.drop_table('fine_tuning_jobs')
