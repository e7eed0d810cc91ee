"""Apply the schema migrations (Alembic) to a PostgreSQL database."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from alembic import command
from alembic.config import Config
from sqlalchemy.exc import OperationalError

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


def run_migration_resource(
    request_type: str, database_url: Callable[[], str], *, physical_id: str | None
) -> tuple[str, str, str]:
    """The CloudFormation custom resource that migrates the schema on every deploy: (status, reason, id).

    Create and Update bring the schema to head (idempotent); Delete leaves the data alone. A failure is
    reported with its reason instead of being raised, so the stack fails fast rather than waiting an hour."""
    resource_id = physical_id or "pagescribe-schema"
    if request_type == "Delete":
        return "SUCCESS", "the schema is kept when the stack is deleted", resource_id
    try:
        _upgrade_when_reachable(database_url(), deadline=time.monotonic() + CONNECT_PATIENCE_SECONDS)
    except Exception as exc:  # every failure must reach CloudFormation as a reason
        log.exception("migration failed")
        return "FAILED", f"migration failed: {type(exc).__name__}: {exc}"[:1000], resource_id
    return "SUCCESS", "database schema is up to date", resource_id
