"""one-time, launch-bound join tokens and security events

api_tokens gains used_at (a join token is consumed by its first registration),
retry_key_hash, request_id and provider (what a launch's token expects);
security_events records refused registrations, replays and authorization failures.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 09:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("used_at", UTCDateTime(), nullable=True))
    op.add_column("api_tokens", sa.Column("retry_key_hash", sa.String(64), nullable=True))
    op.add_column("api_tokens", sa.Column("request_id", sa.String(64), nullable=True))
    op.add_column("api_tokens", sa.Column("provider", sa.String(32), nullable=True))
    # A join token bound to an instance before this revision was already used once.
    op.execute("UPDATE api_tokens SET used_at = created_at WHERE kind = 'join' AND bound_instance IS NOT NULL")
    op.create_table(
        "security_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("client", sa.String(64), nullable=False),
        sa.Column("token_id", sa.String(32), nullable=True),
        sa.Column("token_kind", sa.String(16), nullable=True),
        sa.Column("pool", sa.String(64), nullable=True),
        sa.Column("instance_id", sa.String(128), nullable=True),
        sa.Column("worker_id", sa.String(32), nullable=True),
        sa.Column("detail", sa.Text(), nullable=False),
    )
    op.create_index("ix_security_events_at", "security_events", ["at"])


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35), no batch mode.
    op.drop_index("ix_security_events_at", table_name="security_events")
    op.drop_table("security_events")
    op.drop_column("api_tokens", "provider")
    op.drop_column("api_tokens", "request_id")
    op.drop_column("api_tokens", "retry_key_hash")
    op.drop_column("api_tokens", "used_at")
