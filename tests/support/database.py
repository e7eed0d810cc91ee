"""Reading the database as the tests check it."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from pagescribe.domain import ClaimedJob
from pagescribe.migrate import upgrade_database
from pagescribe.store.postgres import Database
from sqlalchemy import text

ADMIN_URL = os.environ.get("PAGESCRIBE_TEST_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextmanager
def fresh_database() -> Iterator[str]:
    """A new database on the machine's PostgreSQL, migrated to head, dropped on the way out."""
    with fresh_empty_database() as url:
        upgrade_database(url)
        yield url


@contextmanager
def fresh_empty_database() -> Iterator[str]:
    """A new empty database on the machine's PostgreSQL, dropped on the way out."""
    name = f"pagescribe_test_{os.getpid()}_{secrets.token_hex(3)}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = ADMIN_URL.rsplit("/", 1)[0]
    url = f"{base}/{name}".replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield url
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def page_rows(db: Database, document_id: str) -> list[dict[str, Any]]:
    """Every job row of a document, by page."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM jobs WHERE document_id = :id ORDER BY page_number"), {"id": document_id}
        ).mappings()
        return [dict(r) for r in rows]


def claim_one(db: Database, job_id: str, *, lease_seconds: float, max_attempts: int) -> ClaimedJob | None:
    """Claim one job as the transcribe function claims a batch of one: the job, or None when it was not claimable."""
    return db.claim_jobs([job_id], lease_seconds=lease_seconds, max_attempts=max_attempts).claimed.get(job_id)
