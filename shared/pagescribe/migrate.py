"""Apply the schema migrations (Alembic) to a PostgreSQL database."""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import OperationalError

if TYPE_CHECKING:
    from pagescribe.store.postgres.dataapi import DataApi

log = logging.getLogger(__name__)


def alembic_config(sqlalchemy_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", "pagescribe:migrations")
    # ConfigParser interpolation would read a '%' in a password as a placeholder.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade_database(sqlalchemy_url: str) -> None:
    """Bring the database to the newest schema; a database already there is left as it is."""
    command.upgrade(alembic_config(sqlalchemy_url), "head")


def migration_sql(from_revision: str | None) -> list[str]:
    """The statements that bring a database at ``from_revision`` (None: an empty one) to head, as Alembic writes
    them in offline mode, without its BEGIN/COMMIT: the caller runs them in one transaction of its own."""
    buffer = io.StringIO()
    config = Config(output_buffer=buffer)
    config.set_main_option("script_location", "pagescribe:migrations")
    config.set_main_option("sqlalchemy.url", "postgresql+psycopg://")
    command.upgrade(config, f"{from_revision}:head" if from_revision else "head", sql=True)
    script = "\n".join(line for line in buffer.getvalue().splitlines() if not line.startswith("--"))
    statements = (s.strip() for s in re.split(r";\s*\n", script + "\n"))
    return [s for s in statements if s and s not in ("BEGIN", "COMMIT")]


LOCK_MIGRATIONS = "SELECT pg_advisory_xact_lock(7324718)"


def upgrade_through_data_api(api: DataApi) -> None:
    """The Data API profile's migration: Alembic's SQL from the database's own version to head, run through the
    Data API in one transaction that holds the migrators' lock (no DBAPI connection reaches the cluster)."""
    transaction_id = str(api.call("begin_transaction", database=api.database)["transactionId"])
    try:
        api.execute(LOCK_MIGRATIONS, {}, transaction_id)
        present = api.execute("SELECT to_regclass('alembic_version') IS NOT NULL AS present", {}, transaction_id)
        version = (
            api.execute("SELECT version_num FROM alembic_version", {}, transaction_id) if present[0].present else []
        )
        statements = migration_sql(version[0].version_num if version else None)
        for statement in statements:
            api.execute(statement, {}, transaction_id)
    except BaseException:
        api.call("rollback_transaction", transactionId=transaction_id)
        raise
    api.call("commit_transaction", transactionId=transaction_id)
    log.info("schema migrated through the Data API: %d statements", len(statements))


CONNECT_PATIENCE_SECONDS = 90.0


def _upgrade_when_reachable(url: str, *, deadline: float) -> None:
    """Upgrade, retrying while the server cannot be reached: on a new stack RDS Proxy may still be registering
    its target when the migration runs. Any other error is final at once."""
    delay = 2.0
    while True:
        try:
            upgrade_database(url)
            return
        except OperationalError as exc:
            if "does not exist" in str(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("database not reachable yet (%s); retrying in %.0f s", exc.orig, delay)
            time.sleep(delay)
            delay = min(delay * 2, 15.0)


def upgrade_when_reachable(database_url: str) -> None:
    """The direct profile's migration: Alembic on a psycopg connection, waiting for a server not reachable yet."""
    _upgrade_when_reachable(database_url, deadline=time.monotonic() + CONNECT_PATIENCE_SECONDS)


def run_migration_resource(
    request_type: str, upgrade: Callable[[], None], *, physical_id: str | None
) -> tuple[str, str, str]:
    """The CloudFormation custom resource that migrates the schema on every deploy: (status, reason, id).

    Create and Update bring the schema to head (idempotent); Delete leaves the data alone. A failure is
    reported with its reason instead of being raised, so the stack fails fast rather than waiting an hour."""
    resource_id = physical_id or "pagescribe-schema"
    if request_type == "Delete":
        return "SUCCESS", "the schema is kept when the stack is deleted", resource_id
    try:
        upgrade()
    except Exception as exc:  # every failure must reach CloudFormation as a reason
        log.exception("migration failed")
        return "FAILED", f"migration failed: {type(exc).__name__}: {exc}"[:1000], resource_id
    return "SUCCESS", "database schema is up to date", resource_id
