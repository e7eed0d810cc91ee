"""A tenant's latest priced calls found by an index: each call (``attempts``) carries its document's tenant, and the
cost gate's price history (the tenant's latest 100 calls of a model that reported a cost) is read from
``ix_attempts_tenant_price`` instead of every priced call of the model joined to its document and filtered by tenant,
a scan that grew with every call recorded and ran under the gate's locks. It replaces ``ix_attempts_model``, which
served that scan only.

Revision ID: 0023
Revises: 0022
"""

from __future__ import annotations

from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE attempts ADD COLUMN tenant_id text")
    op.execute("UPDATE attempts a SET tenant_id = d.tenant_id FROM documents d WHERE d.id = a.document_id")
    op.execute("ALTER TABLE attempts ALTER COLUMN tenant_id SET NOT NULL")
    op.execute(
        """
        CREATE INDEX ix_attempts_tenant_price ON attempts (tenant_id, model, id DESC)
        WHERE cost IS NOT NULL AND NOT cost_estimated
        """
    )
    op.execute("DROP INDEX ix_attempts_model")


def downgrade() -> None:
    op.execute("CREATE INDEX ix_attempts_model ON attempts (model, id) WHERE cost IS NOT NULL")
    op.execute("DROP INDEX ix_attempts_tenant_price")
    op.execute("ALTER TABLE attempts DROP COLUMN tenant_id")
