"""Corrections of a page by a person, kept as revisions beside the model's answer (which is never overwritten).

A correction holds for the round of answers it was made on: ``jobs.answer_round`` is 1 for a page's first run and
goes up each time the page is queued afresh (a re-run, a retry of a failed page), so a newer answer supersedes the
corrections made before it, which stay as history.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN answer_round integer NOT NULL DEFAULT 1")
    op.execute(
        """
        CREATE TABLE page_corrections (
            document_id  uuid NOT NULL,
            page_number  integer NOT NULL,
            revision     integer NOT NULL CHECK (revision >= 1),
            answer_round integer NOT NULL,
            markdown     text NOT NULL,
            created_at   timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (document_id, page_number, revision),
            FOREIGN KEY (document_id, page_number) REFERENCES jobs (document_id, page_number) ON DELETE CASCADE
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE page_corrections")
    op.execute("ALTER TABLE jobs DROP COLUMN answer_round")
