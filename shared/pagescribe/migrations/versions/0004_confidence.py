"""The offline engine's mean recognition confidence, kept with each page's answer and each recorded call.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN confidence double precision CHECK (confidence BETWEEN 0 AND 1)")
    op.execute("ALTER TABLE attempts ADD COLUMN confidence double precision CHECK (confidence BETWEEN 0 AND 1)")


def downgrade() -> None:
    op.execute("ALTER TABLE attempts DROP COLUMN confidence")
    op.execute("ALTER TABLE jobs DROP COLUMN confidence")
