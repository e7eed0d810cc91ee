"""Page images kept: the key of the image each page was sent to the model as, stored under the transcript's prefix.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE jobs ADD COLUMN image_key text")


def downgrade() -> None:
    op.execute("ALTER TABLE jobs DROP COLUMN image_key")
