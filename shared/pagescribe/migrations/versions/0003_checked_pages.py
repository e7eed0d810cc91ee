"""Checked pages: flags per page, one escalation per page, every paid call recorded, the source's page count.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE documents
            ADD COLUMN escalation_model  text,
            ADD COLUMN source_page_count integer CHECK (source_page_count >= 0)
        """
    )
    op.execute(
        """
        ALTER TABLE jobs
            ADD COLUMN flags      jsonb NOT NULL DEFAULT '[]'::jsonb,
            ADD COLUMN escalation text CHECK (escalation IN ('PENDING', 'DONE'))
        """
    )
    # One row per model call that answered (kept, escalated, rejected, or written after the lease was lost): what
    # it cost is never lost, and a document's spend is the sum over its calls.
    op.execute(
        """
        CREATE TABLE attempts (
            id                  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            job_id              uuid NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
            document_id         uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
            claim               integer NOT NULL,
            outcome             text NOT NULL
                                CHECK (outcome IN ('KEPT', 'ESCALATED', 'REJECTED', 'LEASE_LOST')),
            model               text,
            provider            text,
            finish_reason       text,
            prompt_tokens       integer,
            completion_tokens   integer,
            cost                numeric(14, 8),
            latency_ms          integer,
            provider_request_id text,
            flags               jsonb NOT NULL DEFAULT '[]'::jsonb,
            created_at          timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX ix_attempts_document ON attempts (document_id, job_id)")
    # The calls made before this migration, one per page that kept an answer, so that old documents keep their cost.
    op.execute(
        """
        INSERT INTO attempts (job_id, document_id, claim, outcome, model, provider, finish_reason, prompt_tokens,
                              completion_tokens, cost, latency_ms, provider_request_id, created_at)
        SELECT id, document_id, attempts, CASE WHEN status = 'COMPLETED' THEN 'KEPT' ELSE 'REJECTED' END, model,
               provider, finish_reason, prompt_tokens, completion_tokens, cost, latency_ms, provider_request_id,
               coalesce(completed_at, updated_at)
        FROM jobs
        WHERE model IS NOT NULL AND provider <> 'pdf-text-layer'
        """
    )


def downgrade() -> None:
    op.execute("DROP TABLE attempts")
    op.execute("ALTER TABLE jobs DROP COLUMN flags, DROP COLUMN escalation")
    op.execute("ALTER TABLE documents DROP COLUMN escalation_model, DROP COLUMN source_page_count")
