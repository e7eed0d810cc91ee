"""Apply the schema migrations (Alembic) to a PostgreSQL database."""

from __future__ import annotations

from alembic import command
from alembic.config import Config


def alembic_config(sqlalchemy_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", "pagescribe:migrations")
    # ConfigParser interpolation would read a '%' in a password as a placeholder.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url.replace("%", "%%"))
    return config


def upgrade_database(sqlalchemy_url: str) -> None:
    """Bring the database to the newest schema; a database already there is left as it is."""
    command.upgrade(alembic_config(sqlalchemy_url), "head")
