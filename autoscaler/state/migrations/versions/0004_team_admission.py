"""team_admission, tasks.reclaim_requested, workers.tenancy/unused_cost (admission at lease time)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "team_admission",
        sa.Column("team", sa.String(64), primary_key=True),
        sa.Column("may_scale_up", sa.Boolean(), nullable=False),
        sa.Column("drain", sa.Boolean(), nullable=False),
        sa.Column("fail_safe", sa.Boolean(), nullable=False),
        sa.Column("headroom_usd_per_hour", sa.Float(), nullable=True),
        sa.Column("nominal_gpus", sa.Integer(), nullable=True),
        sa.Column("borrowing_limit_gpus", sa.Integer(), nullable=True),
        sa.Column("lending_limit_gpus", sa.Integer(), nullable=True),
        sa.Column("allowed_pools", sa.JSON(), nullable=True),
        sa.Column("allowed_capacity_types", sa.JSON(), nullable=False),
        sa.Column("priority_tier", sa.Integer(), nullable=False),
        sa.Column("priority_weight", sa.Float(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("decided_at", UTCDateTime(), nullable=False),
    )
    op.add_column("tasks", sa.Column("reclaim_requested", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("workers", sa.Column("tenancy", sa.String(8), nullable=False, server_default="team"))
    op.add_column("workers", sa.Column("unused_cost", sa.String(8), nullable=False, server_default="launcher"))


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35): batch mode would rebuild `tasks` and cascade
    # the delete into task_events.
    op.drop_column("workers", "unused_cost")
    op.drop_column("workers", "tenancy")
    op.drop_column("tasks", "reclaim_requested")
    op.drop_table("team_admission")
