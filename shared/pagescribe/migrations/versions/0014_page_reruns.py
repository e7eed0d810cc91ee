"""Bounded re-runs: ``jobs.reruns`` counts the times a page was re-run (POST .../rerun), each of which also counts
against its document's ``retries`` (MAX_DOCUMENT_RETRIES), as a retry of its failed pages does.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN reruns integer NOT NULL DEFAULT 0")


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN reruns")
