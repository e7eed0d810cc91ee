"""Dense pages read in tiles: ``attempts.tile`` says which tile of a page a call read ("2/4": the second of four
bands), and two outcomes join the ledger: TILE (a call that read one tile of a page) and TILED (a call that read the
whole page and whose answer was read again in tiles: truncated, or its print too small).

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_OUTCOMES = "'KEPT', 'ESCALATED', 'REJECTED', 'LEASE_LOST', 'ERROR', 'RATE_LIMITED', 'LOOP_CUT'"


def upgrade() -> None:
    op.execute("ALTER TABLE attempts ADD COLUMN tile text")
    op.execute(
        f"""
        ALTER TABLE attempts
            DROP CONSTRAINT attempts_outcome_check,
            ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN ({_OUTCOMES}, 'TILE', 'TILED'))
        """
    )


def downgrade() -> None:
    op.execute("DELETE FROM attempts WHERE outcome IN ('TILE', 'TILED')")
    op.execute(
        f"""
        ALTER TABLE attempts
            DROP CONSTRAINT attempts_outcome_check,
            ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN ({_OUTCOMES}))
        """
    )
    op.execute("ALTER TABLE attempts DROP COLUMN tile")
