"""refunds (entry type refund, entries.refund_of) and the rule that an open hold has released nothing

Revision ID: e0d8d49b9b03
Revises: ccaf57a0f1e8
Create Date: 2026-11-30 04:34:54.883908
"""
from alembic import op
import sqlalchemy as sa
from services.common.db import append_only_ddl, drop_append_only_ddl


revision = 'e0d8d49b9b03'
down_revision = 'ccaf57a0f1e8'
branch_labels = None
depends_on = None


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    for statement in drop_append_only_ddl(dialect, "entries"):  # SQLite's batch mode rebuilds the table
        op.execute(statement)
    with op.batch_alter_table('entries', schema=None) as batch_op:
        batch_op.add_column(sa.Column('refund_of', sa.String(length=40), nullable=True))
        batch_op.create_index(batch_op.f('ix_entries_refund_of'), ['refund_of'], unique=False)
        batch_op.drop_constraint(batch_op.f('ck_entries_type_known'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_entries_type_known'), "type IN ('grant', 'hold', 'release', 'charge', 'refund')")
    for statement in append_only_ddl(dialect, "entries"):
        op.execute(statement)
    with op.batch_alter_table('holds', schema=None) as batch_op:
        batch_op.create_check_constraint(batch_op.f('ck_holds_open_releases_nothing'), "status <> 'open' OR released_usd_micros = 0")


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    with op.batch_alter_table('holds', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_holds_open_releases_nothing'), type_='check')
    for statement in drop_append_only_ddl(dialect, "entries"):
        op.execute(statement)
    with op.batch_alter_table('entries', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('ck_entries_type_known'), type_='check')
        batch_op.create_check_constraint(batch_op.f('ck_entries_type_known'), "type IN ('grant', 'hold', 'release', 'charge')")
        batch_op.drop_index(batch_op.f('ix_entries_refund_of'))
        batch_op.drop_column('refund_of')
    for statement in append_only_ddl(dialect, "entries"):
        op.execute(statement)
