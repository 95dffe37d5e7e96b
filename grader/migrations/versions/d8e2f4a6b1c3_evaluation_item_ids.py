"""evaluator track: the items an evaluation covers where not its split's first ones (a pilot on chosen candidates)

Revision ID: d8e2f4a6b1c3
Revises: c5d0e1f2a3b4
Create Date: 2026-12-07 04:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = 'd8e2f4a6b1c3'
down_revision = 'c5d0e1f2a3b4'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('item_ids', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('item_ids')
