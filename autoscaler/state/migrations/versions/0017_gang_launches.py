"""gang launches: instances.launch_request_id and gang_id, api_tokens.max_uses and uses, join_uses

The k machines of one gang launch are k instance rows sharing the launch's request id
(the provider's idempotency key); the launch's join token may register k machines, each
a distinct instance of that launch, once (join_uses, unique per token and instance).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01 19:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("instances", sa.Column("launch_request_id", sa.String(64), nullable=True))
    op.add_column("instances", sa.Column("gang_id", sa.String(32), nullable=True))
    op.create_index("ix_instances_launch_request_id", "instances", ["launch_request_id"])
    op.add_column("api_tokens", sa.Column("max_uses", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("api_tokens", sa.Column("uses", sa.Integer(), nullable=False, server_default="0"))
    op.create_table(
        "join_uses",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("token_id", sa.String(32), sa.ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=False),
        sa.Column("instance_id", sa.String(128), nullable=False),
        sa.Column("worker_id", sa.String(32), nullable=True),
        sa.Column("retry_key_hash", sa.String(64), nullable=True),
        sa.Column("used_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("token_id", "instance_id", name="uq_join_uses_token_instance"),
    )


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35), no batch mode.
    op.drop_table("join_uses")
    op.drop_column("api_tokens", "uses")
    op.drop_column("api_tokens", "max_uses")
    op.drop_index("ix_instances_launch_request_id", table_name="instances")
    op.drop_column("instances", "gang_id")
    op.drop_column("instances", "launch_request_id")
