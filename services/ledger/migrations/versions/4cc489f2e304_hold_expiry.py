"""hold expiry: holds.expires_at and the status 'expired'

Revision ID: 4cc489f2e304
Revises: f3fe38857f62
Create Date: 2026-11-30 01:20:18.509647
"""
from alembic import op
import sqlalchemy as sa
import services.common.db


revision = '4cc489f2e304'
down_revision = 'f3fe38857f62'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('holds', schema=None) as batch_op:
        batch_op.add_column(sa.Column('expires_at', services.common.db.UTCDateTime(timezone=True), nullable=True))
        batch_op.create_index(batch_op.f('ix_holds_expires_at'), ['expires_at'], unique=False)
        batch_op.drop_constraint(batch_op.f('ck_holds_status_known'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_holds_status_known'), "status IN ('open', 'settled', 'released', 'expired')")


def downgrade() -> None:
    with op.batch_alter_table('holds', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_holds_status_known'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_holds_status_known'), "status IN ('open', 'settled', 'released')")
        batch_op.drop_index(batch_op.f('ix_holds_expires_at'))
        batch_op.drop_column('expires_at')

