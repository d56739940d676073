"""Tasks that carry their code: task code/setup/outputs/checkpoint columns, snapshots
and artifacts tables

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

BIGID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TASK_COLUMNS = ("code", "setup", "outputs", "checkpoint_dir", "checkpoint_every_s")


def upgrade() -> None:
    # Nullable, no default: a task from before this revision carries nothing (NULL).
    # Plain ALTER TABLE, not batch mode (which would rebuild `tasks`).
    op.add_column("tasks", sa.Column("code", sa.JSON(), nullable=True))
    op.add_column("tasks", sa.Column("setup", sa.Text(), nullable=True))
    op.add_column("tasks", sa.Column("outputs", sa.JSON(), nullable=True))
    op.add_column("tasks", sa.Column("checkpoint_dir", sa.String(1024), nullable=True))
    op.add_column("tasks", sa.Column("checkpoint_every_s", sa.Integer(), nullable=True))
    op.create_table(
        "snapshots",
        sa.Column("team", sa.String(64), primary_key=True),
        sa.Column("digest", sa.String(80), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "artifacts",
        sa.Column("id", BIGID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(32), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("team", sa.String(64), nullable=False),
        sa.Column("name", sa.String(1024), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(80), nullable=False),
        sa.Column("key", sa.String(1200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.UniqueConstraint("task_id", "name", "attempt", name="uq_artifacts_task_name_attempt"),
    )
    op.create_index("ix_artifacts_created_at", "artifacts", ["created_at"])


def downgrade() -> None:
    # Drops the records, not the stored files (the store is outside the database).
    op.drop_index("ix_artifacts_created_at", table_name="artifacts")
    op.drop_table("artifacts")
    op.drop_table("snapshots")
    for name in reversed(_TASK_COLUMNS):
        op.drop_column("tasks", name)
