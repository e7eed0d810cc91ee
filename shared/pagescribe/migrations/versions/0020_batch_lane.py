"""The batch lane: a document's ``lane`` (sync or batch; NULL: the stack's DEFAULT_LANE) and ``deadline``; the
provider batches its pages are sent in (``provider_batches``), and on each job the lane it was moved to, the batch it
waits in and what the checks need of its render (``batch_evidence``).

A page in the batch lane waits PROCESSING under its lease (the fence its batch's answer is written under), with
``batch_state`` WAITING (rendered, its image kept, not yet sent) or SUBMITTED (in ``batch_id``); ``ix_jobs_batch``
serves the sweeper's hot path over those pages only.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE documents
            ADD COLUMN lane text CHECK (lane IN ('sync', 'batch')),
            ADD COLUMN deadline timestamptz
        """
    )
    op.execute(
        """
        CREATE TABLE provider_batches (
            id uuid PRIMARY KEY,
            provider_batch_id text,
            dialect text NOT NULL,
            model text NOT NULL,
            status text NOT NULL DEFAULT 'submitting',
            submitted_at timestamptz NOT NULL DEFAULT now(),
            expires_at timestamptz NOT NULL,
            input_file_id text,
            output_file_id text,
            error_file_id text,
            request_count integer NOT NULL DEFAULT 0,
            answered_count integer NOT NULL DEFAULT 0,
            failed_count integer NOT NULL DEFAULT 0,
            error text,
            collected_at timestamptz,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("CREATE INDEX ix_provider_batches_open ON provider_batches (submitted_at) WHERE collected_at IS NULL")
    op.execute(
        """
        ALTER TABLE jobs
            ADD COLUMN lane text CHECK (lane IN ('sync', 'batch')),
            ADD COLUMN batch_state text CHECK (batch_state IN ('WAITING', 'SUBMITTED')),
            ADD COLUMN batch_id uuid REFERENCES provider_batches (id),
            ADD COLUMN batch_model text,
            ADD COLUMN batch_evidence jsonb,
            ADD COLUMN batch_submissions integer NOT NULL DEFAULT 0
        """
    )
    op.execute(
        "CREATE INDEX ix_jobs_batch ON jobs (batch_state, batch_model, updated_at) WHERE batch_state IS NOT NULL"
    )
    op.execute("CREATE INDEX ix_jobs_batch_id ON jobs (batch_id) WHERE batch_id IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX ix_jobs_batch_id")
    op.execute("DROP INDEX ix_jobs_batch")
    op.execute(
        """
        ALTER TABLE jobs
            DROP COLUMN batch_submissions, DROP COLUMN batch_evidence, DROP COLUMN batch_model,
            DROP COLUMN batch_id, DROP COLUMN batch_state, DROP COLUMN lane
        """
    )
    op.execute("DROP TABLE provider_batches")
    op.execute("ALTER TABLE documents DROP COLUMN deadline, DROP COLUMN lane")
