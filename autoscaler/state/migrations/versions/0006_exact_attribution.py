"""exact attribution: task_attempts, spend_records.kind/hours/gpu_hours

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

import autoscaler.state.models

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


# Plain ALTER TABLE and CREATE TABLE/INDEX, never batch mode: on SQLite a batch rebuild
# drops and recreates the table (see 0002). DROP COLUMN needs SQLite >= 3.35.


def upgrade() -> None:
    op.create_table(
        "task_attempts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("task_id", sa.String(length=32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("worker_id", sa.String(length=32), nullable=True),
        sa.Column("instance_id", sa.String(length=32), nullable=True),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("started_at", autoscaler.state.models.UTCDateTime(timezone=True), nullable=False),
        sa.Column("ended_at", autoscaler.state.models.UTCDateTime(timezone=True), nullable=True),
        sa.Column("cost_usd", sa.Float(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_task_attempts_task_id", "task_attempts", ["task_id"])
    op.create_index("ix_task_attempts_instance_id", "task_attempts", ["instance_id"])
    op.create_index("ix_task_attempts_ended_at", "task_attempts", ["ended_at"])
    op.create_index("ix_instances_worker_id", "instances", ["worker_id"])
    # Segments written before this revision charged the whole machine to the launcher:
    # they are kept as "unused" (not attributed to a task), with their machine-hours.
    op.add_column("spend_records", sa.Column("kind", sa.String(length=8), nullable=False, server_default="unused"))
    op.add_column("spend_records", sa.Column("hours", sa.Float(), nullable=False, server_default="0"))
    op.add_column("spend_records", sa.Column("gpu_hours", sa.Float(), nullable=False, server_default="0"))
    op.execute("UPDATE spend_records SET hours = cost_usd / hourly_price WHERE hourly_price > 0")
    # Tasks holding GPUs right now get an open attempt, so they are charged from here on.
    op.execute(
        "INSERT INTO task_attempts (task_id, attempt, team, worker_id, instance_id, gpus, started_at, ended_at,"
        " cost_usd, gpu_hours)"
        " SELECT id, attempts, team, worker_id, NULL, gpus, COALESCE(started_at, updated_at), NULL, 0, 0"
        " FROM tasks WHERE state IN ('leased', 'running')"
    )


def downgrade() -> None:
    op.drop_column("spend_records", "gpu_hours")
    op.drop_column("spend_records", "hours")
    op.drop_column("spend_records", "kind")
    op.drop_index("ix_instances_worker_id", table_name="instances")
    op.drop_index("ix_task_attempts_ended_at", table_name="task_attempts")
    op.drop_index("ix_task_attempts_instance_id", table_name="task_attempts")
    op.drop_index("ix_task_attempts_task_id", table_name="task_attempts")
    op.drop_table("task_attempts")
