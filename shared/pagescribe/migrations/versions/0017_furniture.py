"""Running headers, footers and page numbers on request: ``documents.furniture`` says how the markdown shows them
(``mark``: as comments; ``drop``: not at all, the JSON keeps them; ``keep``: as text), decided when the document is
made: its own choice in POST /documents, else FURNITURE.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "ALTER TABLE documents ADD COLUMN furniture text NOT NULL DEFAULT 'mark' "
        "CHECK (furniture IN ('mark', 'drop', 'keep'))"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE documents DROP COLUMN furniture")
