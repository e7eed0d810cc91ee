"""Tables that cross pages joined by the finish pass: ``documents.merge_tables`` says whether they are (decided when
the document is made: its own choice in POST /documents, else MERGE_TABLES; on by default).

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE documents ADD COLUMN merge_tables boolean NOT NULL DEFAULT true")


def downgrade() -> None:
    op.execute("ALTER TABLE documents DROP COLUMN merge_tables")
