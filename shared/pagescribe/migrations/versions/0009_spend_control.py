"""Spend under control: the rate governor's shared token buckets, per-document cost caps, per-tenant daily budgets,
pages SKIPPED for budget, and every model call recorded, including those that failed.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # One bucket per provider and model, shared by every environment: request and token allowances refilled
    # continuously, and the pause a 429 opened. ``requests`` goes below zero by the slots reserved ahead.
    op.execute(
        """
        CREATE TABLE rate_buckets (
            provider     text NOT NULL,
            model        text NOT NULL,
            requests     double precision NOT NULL,
            tokens       double precision NOT NULL,
            mean_tokens  double precision,
            refilled_at  timestamptz NOT NULL DEFAULT now(),
            paused_until timestamptz,
            PRIMARY KEY (provider, model)
        )
        """
    )
    op.execute(
        """
        ALTER TABLE jobs
            DROP CONSTRAINT jobs_status_check,
            ADD CONSTRAINT jobs_status_check
                CHECK (status IN ('QUEUED', 'PROCESSING', 'COMPLETED', 'FAILED', 'SKIPPED')),
            ADD COLUMN rate_slot_at timestamptz,
            ADD COLUMN reserved_usd numeric(14, 8)
        """
    )
    op.execute("ALTER TABLE documents ADD COLUMN max_cost_usd numeric(14, 8) CHECK (max_cost_usd >= 0)")
    op.execute("ALTER TABLE tenants ADD COLUMN daily_budget_usd numeric(14, 8) CHECK (daily_budget_usd >= 0)")
    # What each tenant spent each (UTC) day, moved by every recorded call in the statement that records it.
    op.execute(
        """
        CREATE TABLE tenant_days (
            tenant_id text NOT NULL,
            day       date NOT NULL,
            spent_usd numeric(18, 8) NOT NULL DEFAULT 0,
            calls     bigint NOT NULL DEFAULT 0,
            PRIMARY KEY (tenant_id, day)
        )
        """
    )
    op.execute(
        """
        ALTER TABLE attempts
            DROP CONSTRAINT attempts_outcome_check,
            ADD CONSTRAINT attempts_outcome_check
                CHECK (outcome IN ('KEPT', 'ESCALATED', 'REJECTED', 'LEASE_LOST', 'ERROR', 'RATE_LIMITED')),
            ADD COLUMN status_code integer,
            ADD COLUMN error text
        """
    )
    # The calls in flight whose price is held against a cap or a budget: few at any time.
    op.execute("CREATE INDEX ix_jobs_reserved ON jobs (document_id) WHERE reserved_usd IS NOT NULL")
    # The estimate's history: the latest calls of a model.
    op.execute("CREATE INDEX ix_attempts_model ON attempts (model, id) WHERE cost IS NOT NULL")


def downgrade() -> None:
    op.execute("DROP INDEX ix_attempts_model")
    op.execute("DROP INDEX ix_jobs_reserved")
    op.execute("DELETE FROM attempts WHERE outcome IN ('ERROR', 'RATE_LIMITED')")
    op.execute(
        """
        ALTER TABLE attempts
            DROP COLUMN error, DROP COLUMN status_code,
            DROP CONSTRAINT attempts_outcome_check,
            ADD CONSTRAINT attempts_outcome_check CHECK (outcome IN ('KEPT', 'ESCALATED', 'REJECTED', 'LEASE_LOST'))
        """
    )
    op.execute("DROP TABLE tenant_days")
    op.execute("ALTER TABLE tenants DROP COLUMN daily_budget_usd")
    op.execute("ALTER TABLE documents DROP COLUMN max_cost_usd")
    op.execute("UPDATE jobs SET status = 'FAILED' WHERE status = 'SKIPPED'")
    op.execute(
        """
        ALTER TABLE jobs
            DROP COLUMN reserved_usd, DROP COLUMN rate_slot_at,
            DROP CONSTRAINT jobs_status_check,
            ADD CONSTRAINT jobs_status_check CHECK (status IN ('QUEUED', 'PROCESSING', 'COMPLETED', 'FAILED'))
        """
    )
    op.execute("DROP TABLE rate_buckets")
