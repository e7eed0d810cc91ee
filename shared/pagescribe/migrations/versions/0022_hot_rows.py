"""Hot rows sharded: a tenant's day (``tenant_days``) is counted in several rows (``shard``, a page's by its number),
summed when read, so that a tenant's calls no longer pass one at a time through one row. The rows there were become
shard 0.

A document's count moves off its row: ``document_counts`` holds, per document and shard, the pages ended and the
money its calls spent (the running total the cost gate reads instead of summing the document's calls). A document's
pages ended are its row's count (moved by the sweeper, retries and re-runs) plus its shards'. What documents spent
so far becomes their shard 0.

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE tenant_days
            ADD COLUMN shard smallint NOT NULL DEFAULT 0,
            DROP CONSTRAINT tenant_days_pkey,
            ADD PRIMARY KEY (tenant_id, day, shard)
        """
    )
    op.execute(
        """
        CREATE TABLE document_counts (
            document_id     uuid NOT NULL REFERENCES documents (id) ON DELETE CASCADE,
            shard           smallint NOT NULL,
            pages_completed integer NOT NULL DEFAULT 0,
            pages_failed    integer NOT NULL DEFAULT 0,
            spent_usd       numeric(18, 8) NOT NULL DEFAULT 0,
            updated_at      timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (document_id, shard)
        )
        """
    )
    op.execute(
        """
        INSERT INTO document_counts (document_id, shard, spent_usd)
        SELECT document_id, 0, sum(cost) FROM attempts WHERE cost IS NOT NULL GROUP BY document_id
        """
    )


def downgrade() -> None:
    # a document's shards' pages go back to its row's count
    op.execute(
        """
        UPDATE documents d
        SET pages_completed = d.pages_completed + c.completed, pages_failed = d.pages_failed + c.failed
        FROM (
            SELECT document_id, sum(pages_completed) AS completed, sum(pages_failed) AS failed
            FROM document_counts GROUP BY document_id
        ) c
        WHERE d.id = c.document_id
        """
    )
    op.execute("DROP TABLE document_counts")
    # every shard of a day summed into shard 0, then the shard column goes
    op.execute(
        """
        WITH moved AS (
            DELETE FROM tenant_days WHERE shard <> 0 RETURNING tenant_id, day, spent_usd, calls
        ),
        summed AS (
            SELECT tenant_id, day, sum(spent_usd) AS spent_usd, sum(calls) AS calls FROM moved GROUP BY tenant_id, day
        )
        INSERT INTO tenant_days AS t (tenant_id, day, shard, spent_usd, calls)
        SELECT tenant_id, day, 0, spent_usd, calls FROM summed
        ON CONFLICT (tenant_id, day, shard)
        DO UPDATE SET spent_usd = t.spent_usd + excluded.spent_usd, calls = t.calls + excluded.calls
        """
    )
    op.execute(
        """
        ALTER TABLE tenant_days
            DROP CONSTRAINT tenant_days_pkey,
            DROP COLUMN shard,
            ADD PRIMARY KEY (tenant_id, day)
        """
    )
