"""Hot rows sharded: a tenant's day (``tenant_days``) is counted in several rows (``shard``, a page's by its number),
summed when read, so that a tenant's calls no longer pass one at a time through one row. The rows there were become
shard 0.

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


def downgrade() -> None:
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
