"""model_prices: registered base models' prices per token kind

Revision ID: a496aa8552e7
Revises: 7b1e2c9d4f10
Create Date: 2026-11-30 21:26:57.588258
"""
from alembic import op
import sqlalchemy as sa
import services.common.db


revision = 'a496aa8552e7'
down_revision = '7b1e2c9d4f10'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('model_prices',
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('usd_micros_per_million_units', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', services.common.db.UTCDateTime(timezone=True), nullable=False),
    sa.CheckConstraint('usd_micros_per_million_units >= 0', name=op.f('ck_model_prices_price_nonnegative')),
    sa.PrimaryKeyConstraint('model', 'kind', name=op.f('pk_model_prices'))
    )


def downgrade() -> None:
    op.drop_table('model_prices')
