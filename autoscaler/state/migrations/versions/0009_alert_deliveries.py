"""alert_events, alert_deliveries, alert_conditions (notifications: delivered once per crossing)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "alert_events",
        sa.Column("id", BIGID, primary_key=True, autoincrement=True),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("team", sa.String(64), nullable=True),
        sa.Column("level", sa.String(16), nullable=False),
        sa.Column("period", sa.String(7), nullable=True),
        sa.Column("threshold_pct", sa.Float(), nullable=True),
        sa.Column("basis", sa.String(16), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("key"),
    )
    op.create_index("ix_alert_events_created_at", "alert_events", ["created_at"])
    op.create_table(
        "alert_deliveries",
        sa.Column("id", BIGID, primary_key=True, autoincrement=True),
        sa.Column("event_id", BIGID, sa.ForeignKey("alert_events.id", ondelete="CASCADE"), nullable=False),
        sa.Column("channel", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False),
        sa.Column("claimed_until", UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("delivered_at", UTCDateTime(), nullable=True),
        sa.UniqueConstraint("event_id", "channel", name="uq_alert_deliveries_event_channel"),
    )
    op.create_index("ix_alert_deliveries_due", "alert_deliveries", ["status", "next_attempt_at"])
    op.create_table(
        "alert_conditions",
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("since", UTCDateTime(), nullable=False),
        sa.Column("last_seen", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alert_conditions")
    op.drop_index("ix_alert_deliveries_due", table_name="alert_deliveries")
    op.drop_table("alert_deliveries")
    op.drop_index("ix_alert_events_created_at", table_name="alert_events")
    op.drop_table("alert_events")
