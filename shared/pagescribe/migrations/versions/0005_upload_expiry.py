"""Documents awaiting their upload, found by age: the sweeper ends those whose file never arrived.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_documents_awaiting_upload ON documents (created_at) WHERE status = 'AWAITING_UPLOAD'")


def downgrade() -> None:
    op.execute("DROP INDEX ix_documents_awaiting_upload")
