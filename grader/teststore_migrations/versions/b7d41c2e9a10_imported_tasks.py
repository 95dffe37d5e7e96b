"""imported tasks

Revision ID: b7d41c2e9a10
Revises: eef698a1e946
Create Date: 2026-12-06 20:20:00
"""
from alembic import op
import sqlalchemy as sa


revision = 'b7d41c2e9a10'
down_revision = 'eef698a1e946'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('imported_tasks',
    sa.Column('pk', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('collection', sa.String(length=64), nullable=False),
    sa.Column('suite', sa.String(length=40), nullable=False),
    sa.Column('name', sa.String(length=40), nullable=False),
    sa.Column('instruction', sa.Text(), nullable=False),
    sa.Column('digest', sa.String(length=64), nullable=False),
    sa.Column('archive', sa.LargeBinary(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('pk'),
    sa.UniqueConstraint('collection', 'name')
    )
    with op.batch_alter_table('imported_tasks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_imported_tasks_collection'), ['collection'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('imported_tasks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_imported_tasks_collection'))
    op.drop_table('imported_tasks')
