"""Nothing paid twice: a document's bytes by SHA-256, so that the same file for the same request reuses a finished
transcript; and the first answer to each Idempotency-Key of POST /documents.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE documents
            ADD COLUMN sha256 bytea CHECK (octet_length(sha256) = 32),
            ADD COLUMN reuse boolean NOT NULL DEFAULT true,
            ADD COLUMN reused_from uuid REFERENCES documents (id) ON DELETE SET NULL
        """
    )
    op.execute("CREATE INDEX ix_documents_reusable ON documents (tenant_id, sha256) WHERE status = 'COMPLETED'")
    op.execute(
        """
        CREATE TABLE idempotency_keys (
            tenant_id   text NOT NULL REFERENCES tenants (id),
            key         text NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
            request     bytea NOT NULL,
            document_id uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
            answer      jsonb NOT NULL,
            created_at  timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (tenant_id, key)
        )
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE idempotency_keys")
    op.execute("DROP INDEX ix_documents_reusable")
    op.execute("ALTER TABLE documents DROP COLUMN reused_from, DROP COLUMN reuse, DROP COLUMN sha256")
