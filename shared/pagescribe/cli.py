"""The ``pagescribe`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pagescribe.migrate import upgrade_database
from pagescribe.settings import ConfigurationError, get_settings


def _migrate(_: argparse.Namespace) -> int:
    settings = get_settings()
    upgrade_database(settings.sqlalchemy_url)
    print("database schema is up to date")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pagescribe", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    migrate = commands.add_parser("migrate", help="apply the schema migrations to DATABASE_URL")
    migrate.set_defaults(run=_migrate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except ConfigurationError as exc:
        print(f"pagescribe: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
