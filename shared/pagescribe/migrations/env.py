"""Alembic environment: runs the migrations on the connection or URL handed over by pagescribe.migrate."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, text

config = context.config


def run_migrations_online() -> None:
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL was given to the migrations")
    engine = create_engine(url, connect_args={"prepare_threshold": None})
    try:
        with engine.connect() as connection:
            # Two migrators at once (two cold starts, two local commands) must not race: the lock is held
            # only by this short-lived migration session, never on the request path.
            connection.execute(text("SELECT pg_advisory_xact_lock(7324718)"))
            context.configure(connection=connection, transaction_per_migration=False)
            with context.begin_transaction():
                context.run_migrations()
            connection.commit()
    finally:
        engine.dispose()


def run_migrations_offline() -> None:
    """The migrations as SQL text (``pagescribe.migrate.migration_sql``): what the Data API profile runs."""
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True, transaction_per_migration=False)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
