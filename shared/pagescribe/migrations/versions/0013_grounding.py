"""Grounded transcripts: each page's answer aligned to the page's own text, and the second read that made it possible.

``jobs.grounding`` holds the kept answer's grounding (the source it was aligned to, each block's box and share of
characters aligned, the unsupported spans and missed regions, the page image's size), written with the answer under
the page's lease; NULL where nothing on the page could ground it (or before this migration). ``attempts.second_read``
holds what the offline engine read of the page while that call was in flight (its lines, boxes, confidence and CPU
time), or why the page went without. ``documents.second_read`` is the document's choice (auto, always, off); NULL
takes the stack's SECOND_READ.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN grounding jsonb")
    op.execute("ALTER TABLE attempts ADD COLUMN second_read jsonb")
    op.execute(
        "ALTER TABLE documents ADD COLUMN second_read text "
        "CHECK (second_read IS NULL OR second_read IN ('auto', 'always', 'off'))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE documents DROP COLUMN second_read")
    op.execute("ALTER TABLE attempts DROP COLUMN second_read")
    op.execute("ALTER TABLE jobs DROP COLUMN grounding")
