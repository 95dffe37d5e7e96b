"""Tinker's primitives: sessions, live models, samplers, saved weights and requests

Revision ID: 6c1d2e3f4a5b
Revises: 3b7e41c2a9d5
Create Date: 2026-12-06 13:00:00.000000
"""
from alembic import op
import sqlalchemy as sa
import services.common.db

revision = '6c1d2e3f4a5b'
down_revision = '3b7e41c2a9d5'
branch_labels = None
depends_on = None

UTC = services.common.db.UTCDateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        'primitive_sessions',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('run_context', sa.JSON(), nullable=False),
        sa.Column('user_metadata', sa.JSON(), nullable=False),
        sa.Column('created_at', UTC, nullable=False),
        sa.Column('heartbeat_at', UTC, nullable=True),
        sa.Column('finished_at', UTC, nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_primitive_sessions_run_id', 'primitive_sessions', ['run_id'])
    op.create_table(
        'live_models',
        sa.Column('id', sa.String(length=120), nullable=False),
        sa.Column('session_id', sa.String(length=40), sa.ForeignKey('primitive_sessions.id'), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('job_id', sa.String(length=40), sa.ForeignKey('training_jobs.id'), nullable=False),
        sa.Column('base_model', sa.String(length=100), nullable=False),
        sa.Column('lora', sa.JSON(), nullable=False),
        sa.Column('applied_seq', sa.Integer(), nullable=False),
        sa.Column('state_uri', sa.Text(), nullable=True),
        sa.Column('state_seq', sa.Integer(), nullable=False),
        sa.Column('created_at', UTC, nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_live_models_session_id', 'live_models', ['session_id'])
    op.create_index('ix_live_models_run_id', 'live_models', ['run_id'])
    op.create_table(
        'primitive_samplers',
        sa.Column('id', sa.String(length=120), nullable=False),
        sa.Column('session_id', sa.String(length=40), sa.ForeignKey('primitive_sessions.id'), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('model_id', sa.String(length=120), sa.ForeignKey('live_models.id'), nullable=False),
        sa.Column('base_model', sa.String(length=100), nullable=False),
        sa.Column('checkpoint_id', sa.String(length=40), nullable=True),
        sa.Column('model_path', sa.Text(), nullable=True),
        sa.Column('created_at', UTC, nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_primitive_samplers_session_id', 'primitive_samplers', ['session_id'])
    op.create_index('ix_primitive_samplers_run_id', 'primitive_samplers', ['run_id'])
    op.create_table(
        'primitive_weights',
        sa.Column('path', sa.String(length=400), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('model_id', sa.String(length=120), nullable=False),
        sa.Column('kind', sa.String(length=20), nullable=False),
        sa.Column('checkpoint_id', sa.String(length=40), nullable=True),
        sa.Column('uri', sa.Text(), nullable=True),
        sa.Column('created_at', UTC, nullable=False),
        sa.PrimaryKeyConstraint('path'),
    )
    op.create_index('ix_primitive_weights_run_id', 'primitive_weights', ['run_id'])
    op.create_table(
        'primitive_requests',
        sa.Column('id', sa.String(length=40), nullable=False),
        sa.Column('run_id', sa.String(length=40), nullable=False),
        sa.Column('model_id', sa.String(length=120), sa.ForeignKey('live_models.id'), nullable=False),
        sa.Column('sampler_id', sa.String(length=120), nullable=True),
        sa.Column('seq', sa.Integer(), nullable=True),
        sa.Column('kind', sa.String(length=40), nullable=False),
        sa.Column('payload', sa.LargeBinary(), nullable=False),
        sa.Column('status', sa.String(length=10), nullable=False),
        sa.Column('result', sa.LargeBinary(), nullable=True),
        sa.Column('result_proto', sa.Boolean(), nullable=False),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('category', sa.String(length=10), nullable=True),
        sa.Column('hold_id', sa.String(length=40), nullable=True),
        sa.Column('created_at', UTC, nullable=False),
        sa.Column('finished_at', UTC, nullable=True),
        sa.PrimaryKeyConstraint('id'),
    )
    op.create_index('ix_primitive_requests_run_id', 'primitive_requests', ['run_id'])
    op.create_index('ix_primitive_requests_model_status', 'primitive_requests', ['model_id', 'status'])


def downgrade() -> None:
    for table in ('primitive_requests', 'primitive_weights', 'primitive_samplers', 'live_models', 'primitive_sessions'):
        op.drop_table(table)
