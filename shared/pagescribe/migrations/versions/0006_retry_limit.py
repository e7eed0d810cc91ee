"""How many times each document's failed pages were retried: POST /retry is bounded per document.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE documents ADD COLUMN retries integer NOT NULL DEFAULT 0 CHECK (retries >= 0)")


def downgrade() -> None:
    op.execute("ALTER TABLE documents DROP COLUMN retries")
