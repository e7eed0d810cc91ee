"""Documents created through the API before their upload; completion callbacks.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE documents DROP CONSTRAINT documents_status_check")
    op.execute(
        "ALTER TABLE documents ADD CONSTRAINT documents_status_check "
        "CHECK (status IN ('AWAITING_UPLOAD', 'PROCESSING', 'COMPLETED', 'PARTIAL', 'FAILED'))"
    )
    op.execute(
        """
        ALTER TABLE documents
            ADD COLUMN filename          text,
            ADD COLUMN requested_pages   integer[],
            ADD COLUMN callback_url      text,
            ADD COLUMN callback_status   text
                CHECK (callback_status IN ('PENDING', 'DELIVERED', 'FAILED')),
            ADD COLUMN callback_attempts integer NOT NULL DEFAULT 0,
            ADD COLUMN callback_next_at  timestamptz,
            ADD COLUMN callback_error    text
        """
    )
    op.execute("CREATE INDEX ix_documents_callbacks ON documents (callback_next_at) WHERE callback_status = 'PENDING'")


def downgrade() -> None:
    op.execute("DROP INDEX ix_documents_callbacks")
    op.execute(
        """
        ALTER TABLE documents
            DROP COLUMN filename, DROP COLUMN requested_pages, DROP COLUMN callback_url,
            DROP COLUMN callback_status, DROP COLUMN callback_attempts, DROP COLUMN callback_next_at,
            DROP COLUMN callback_error
        """
    )
    op.execute("DELETE FROM documents WHERE status = 'AWAITING_UPLOAD'")
    op.execute("ALTER TABLE documents DROP CONSTRAINT documents_status_check")
    op.execute(
        "ALTER TABLE documents ADD CONSTRAINT documents_status_check "
        "CHECK (status IN ('PROCESSING', 'COMPLETED', 'PARTIAL', 'FAILED'))"
    )
