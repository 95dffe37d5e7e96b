"""grading tasks: the table ``benchmarks`` (one grading task each) becomes ``grading_tasks``, the columns that point at
it ``benchmark_id`` -> ``task_id``, and the stored spec's key ``benchmark_id`` -> ``task_id`` (GradingSpec's field)

Revision ID: 4de6b00d3c57
Revises: 8165a11feef4
Create Date: 2026-12-01 10:00:00.000000
"""
import sqlalchemy as sa
from alembic import op

revision = '4de6b00d3c57'
down_revision = '8165a11feef4'
branch_labels = None
depends_on = None

POINTING = ('validation_items', 'evaluations', 'submissions')  # tables whose column names a grading task


def _rename_spec_key(table: str, old: str, new: str) -> None:
    """Rename key ``old`` of every row's ``spec`` JSON in ``table`` to ``new`` (rows without it are left as they are)."""
    specs = sa.table(table, sa.column('id', sa.String), sa.column('spec', sa.JSON))
    bind = op.get_bind()
    for row_id, spec in bind.execute(sa.select(specs.c.id, specs.c.spec)).all():
        if old in spec:
            spec = {(new if k == old else k): v for k, v in spec.items()}
            bind.execute(specs.update().where(specs.c.id == row_id).values(spec=spec))


def _rename_column(old: str, new: str) -> None:
    for table in POINTING:
        op.drop_index(f'ix_{table}_{old}', table_name=table)
        with op.batch_alter_table(table, schema=None) as batch_op:  # SQLite: the table is copied under the new column name
            batch_op.alter_column(old, new_column_name=new)
        op.create_index(f'ix_{table}_{new}', table, [new], unique=False)


def upgrade() -> None:
    op.rename_table('benchmarks', 'grading_tasks')
    _rename_column('benchmark_id', 'task_id')
    _rename_spec_key('grading_tasks', 'benchmark_id', 'task_id')


def downgrade() -> None:
    _rename_spec_key('grading_tasks', 'task_id', 'benchmark_id')
    _rename_column('task_id', 'benchmark_id')
    op.rename_table('grading_tasks', 'benchmarks')
