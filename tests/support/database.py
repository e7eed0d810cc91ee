"""Reading the database as the tests check it."""

from __future__ import annotations

from typing import Any

from pagescribe.database import Database
from sqlalchemy import text


def page_rows(db: Database, document_id: str) -> list[dict[str, Any]]:
    """Every job row of a document, by page."""
    with db.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT * FROM jobs WHERE document_id = :id ORDER BY page_number"), {"id": document_id}
        ).mappings()
        return [dict(r) for r in rows]
