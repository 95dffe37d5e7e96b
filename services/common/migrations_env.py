"""The body of every service's Alembic ``env.py``: run migrations online against the configured URL.

Each service's ``migrations/env.py`` is two lines: import its ``models`` metadata and call
:func:`run_migrations`. SQLite gets batch mode so ``ALTER TABLE`` works there too.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import MetaData, create_engine, pool


def run_migrations(metadata: MetaData) -> None:
    """Upgrade/downgrade the database at ``sqlalchemy.url`` for ``metadata`` (online mode only)."""
    url = context.config.get_main_option("sqlalchemy.url")
    engine = create_engine(url, poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()
