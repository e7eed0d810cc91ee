"""Loops cut: a streamed call closed at the first loop in its answer is recorded as ``LOOP_CUT``, and
``attempts.cost_estimated`` marks a cost (with the tokens the provider did not report) that pagescribe estimated at the
tenant's own prices because the provider sent none (its usage comes in the last event, which a cut call never gets).

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        """
        ALTER TABLE attempts
            DROP CONSTRAINT attempts_outcome_check,
            ADD CONSTRAINT attempts_outcome_check
                CHECK (outcome IN ('KEPT', 'ESCALATED', 'REJECTED', 'LEASE_LOST', 'ERROR', 'RATE_LIMITED', 'LOOP_CUT')),
            ADD COLUMN cost_estimated boolean NOT NULL DEFAULT false
        """
    )


def downgrade() -> None:
    # a cut call's answer was not kept: it reads as one rejected
    op.execute("UPDATE attempts SET outcome = 'REJECTED' WHERE outcome = 'LOOP_CUT'")
    op.execute(
        """
        ALTER TABLE attempts
            DROP CONSTRAINT attempts_outcome_check,
            ADD CONSTRAINT attempts_outcome_check
                CHECK (outcome IN ('KEPT', 'ESCALATED', 'REJECTED', 'LEASE_LOST', 'ERROR', 'RATE_LIMITED')),
            DROP COLUMN cost_estimated
        """
    )
