"""Tenants: API keys stored hashed, each document a tenant's, a callback secret per tenant.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        CREATE TABLE tenants (
            id text PRIMARY KEY CHECK (id ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
            callback_secret text,
            created_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute("INSERT INTO tenants (id) VALUES ('default')")
    op.execute(
        """
        CREATE TABLE api_keys (
            id uuid PRIMARY KEY,
            tenant_id text NOT NULL REFERENCES tenants (id),
            key_hash bytea NOT NULL UNIQUE,
            label text NOT NULL,
            created_at timestamptz NOT NULL DEFAULT now(),
            revoked_at timestamptz
        )
        """
    )
    op.execute("CREATE INDEX ix_api_keys_tenant ON api_keys (tenant_id)")
    op.execute("ALTER TABLE documents ADD COLUMN tenant_id text NOT NULL DEFAULT 'default' REFERENCES tenants (id)")
    op.execute("CREATE INDEX ix_documents_tenant ON documents (tenant_id, created_at)")


def downgrade() -> None:
    op.execute("DROP INDEX ix_documents_tenant")
    op.execute("ALTER TABLE documents DROP COLUMN tenant_id")
    op.execute("DROP TABLE api_keys")
    op.execute("DROP TABLE tenants")
