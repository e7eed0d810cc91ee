"""Figures kept: ``jobs.figures`` lists the figures cropped from a page's image and stored beside the transcript
(each its key and box).

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN figures jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN figures")
