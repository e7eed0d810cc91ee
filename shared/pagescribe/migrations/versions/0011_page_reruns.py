"""Re-running one page, optionally on another model: the model a re-run asked for, kept on the page.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN requested_model text")


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN requested_model")
