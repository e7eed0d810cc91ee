"""Documents and their page jobs.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE documents (
            id              uuid PRIMARY KEY,
            bucket          text NOT NULL,
            object_key      text NOT NULL,
            etag            text NOT NULL,
            version_id      text NOT NULL DEFAULT '',
            size_bytes      bigint NOT NULL,
            kind            text,
            page_count      integer NOT NULL DEFAULT 0 CHECK (page_count >= 0),
            status          text NOT NULL
                            CHECK (status IN ('PROCESSING', 'COMPLETED', 'PARTIAL', 'FAILED')),
            error           text,
            model           text NOT NULL,
            prompt          text,
            pages_completed integer NOT NULL DEFAULT 0,
            pages_failed    integer NOT NULL DEFAULT 0,
            transcript_key  text,
            created_at      timestamptz NOT NULL DEFAULT now(),
            updated_at      timestamptz NOT NULL DEFAULT now(),
            finished_at     timestamptz,
            CONSTRAINT uq_documents_object UNIQUE (bucket, object_key, etag, version_id)
        )
        """
    )
    op.execute(
        """
        CREATE TABLE jobs (
            id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
            document_id         uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
            page_number         integer NOT NULL CHECK (page_number >= 1),
            status              text NOT NULL DEFAULT 'QUEUED'
                                CHECK (status IN ('QUEUED', 'PROCESSING', 'COMPLETED', 'FAILED')),
            attempts            integer NOT NULL DEFAULT 0,
            lease_token         uuid,
            lease_expires_at    timestamptz,
            available_at        timestamptz NOT NULL DEFAULT now(),
            enqueued_at         timestamptz,
            result_text         text,
            finish_reason       text,
            prompt_tokens       integer,
            completion_tokens   integer,
            cost                numeric(14, 8),
            model               text,
            provider            text,
            provider_request_id text,
            latency_ms          integer,
            error               text,
            created_at          timestamptz NOT NULL DEFAULT now(),
            updated_at          timestamptz NOT NULL DEFAULT now(),
            started_at          timestamptz,
            completed_at        timestamptz,
            CONSTRAINT uq_jobs_page UNIQUE (document_id, page_number)
        )
        """
    )
    # Hot paths, each served by a partial index over the few rows it can match.
    op.execute("CREATE INDEX ix_jobs_queued ON jobs (created_at, page_number) WHERE status = 'QUEUED'")
    op.execute("CREATE INDEX ix_jobs_leases ON jobs (lease_expires_at) WHERE status = 'PROCESSING'")
    op.execute("CREATE INDEX ix_documents_unfinished ON documents (updated_at) WHERE finished_at IS NULL")


def downgrade() -> None:
    op.execute("DROP TABLE jobs")
    op.execute("DROP TABLE documents")
