"""Chunks for retrieval stored beside the transcript: ``documents.chunks`` says whether the finish writes
``<transcript>.chunks.jsonl`` (decided when the document is made: its own choice in POST /documents, else CHUNKS).

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE documents ADD COLUMN chunks boolean NOT NULL DEFAULT false")


def downgrade() -> None:
    op.execute("ALTER TABLE documents DROP COLUMN chunks")
