"""per-worker GPU samples and the GPU indices of each task attempt

gpu_samples keeps each worker's GPU utilisation and memory over time (bounded by the
retention settings); task_attempts gains gpu_indices, which of the worker's GPUs an
attempt held, so a task's GPU use can be read from its worker's samples.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 12:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gpu_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("worker_id", sa.String(32), nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("utilization_pct", sa.Float(), nullable=False),
        sa.Column("memory_used_mb", sa.Float(), nullable=False),
        sa.Column("memory_total_mb", sa.Float(), nullable=False),
    )
    op.create_index("ix_gpu_samples_at", "gpu_samples", ["at"])
    op.create_index("ix_gpu_samples_worker_at", "gpu_samples", ["worker_id", "at"])
    op.add_column("task_attempts", sa.Column("gpu_indices", sa.JSON(none_as_null=True), nullable=True))
    # A task running now holds the indices its row names; older attempts are unknown.
    op.execute(
        "UPDATE task_attempts SET gpu_indices = (SELECT tasks.gpu_indices FROM tasks "
        "WHERE tasks.id = task_attempts.task_id) WHERE ended_at IS NULL"
    )


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35), no batch mode.
    op.drop_column("task_attempts", "gpu_indices")
    op.drop_index("ix_gpu_samples_worker_at", table_name="gpu_samples")
    op.drop_index("ix_gpu_samples_at", table_name="gpu_samples")
    op.drop_table("gpu_samples")
