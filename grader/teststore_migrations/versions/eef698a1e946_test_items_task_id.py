"""test items: ``benchmark_id`` -> ``task_id`` (the grader's id of one grading task)

Revision ID: eef698a1e946
Revises: e39a51a2124f
Create Date: 2026-12-01 10:00:00.000000
"""
from alembic import op

revision = 'eef698a1e946'
down_revision = 'e39a51a2124f'
branch_labels = None
depends_on = None


def _rename_column(old: str, new: str) -> None:
    op.drop_index(f'ix_test_items_{old}', table_name='test_items')
    with op.batch_alter_table('test_items', schema=None) as batch_op:  # SQLite: the table is copied under the new column name
        batch_op.alter_column(old, new_column_name=new)
    op.create_index(f'ix_test_items_{new}', 'test_items', [new], unique=False)


def upgrade() -> None:
    _rename_column('benchmark_id', 'task_id')


def downgrade() -> None:
    _rename_column('task_id', 'benchmark_id')
