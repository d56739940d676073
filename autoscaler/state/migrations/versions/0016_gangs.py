"""multi-node tasks (gangs): tasks.nodes, task_ranks, task_logs.rank, workers.address

A task runs on `nodes` machines at once; each of its ranks is a row of task_ranks
(worker, GPUs, state, exit code); a log chunk says which rank wrote it; a worker keeps
the private address its agent reported (rank 0's is the gang's MASTER_ADDR). The demand
covering index gains `nodes` (the snapshot sums machines, not tasks).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-01 15:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from autoscaler.state.models import UTCDateTime

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

# ix_tasks_demand as of 0015; this revision appends `nodes`.
_DEMAND = [
    "state",
    "unschedulable_reason",
    "queue",
    "team",
    "gpus",
    "gpu_type",
    "priority",
    "cpus",
    "memory_mb",
    "runtime_class_s",
    "checkpoints",
    "end_reason",
    "sort_key",
]


def upgrade() -> None:
    op.add_column("tasks", sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
    op.add_column("task_logs", sa.Column("rank", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("workers", sa.Column("address", sa.String(255), nullable=True))
    op.create_table(
        "task_ranks",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(32), sa.ForeignKey("tasks.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(32), nullable=False),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("end_reason", sa.String(64), nullable=True),
        sa.Column("reserved_at", UTCDateTime(), nullable=False),
        sa.Column("delivered_at", UTCDateTime(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
    )
    op.create_index("ix_task_ranks_task", "task_ranks", ["task_id", "attempt", "rank"])
    op.create_index("ix_task_ranks_state", "task_ranks", ["state"])
    op.create_index("ix_task_ranks_worker_id", "task_ranks", ["worker_id"])
    op.drop_index("ix_tasks_demand", table_name="tasks")
    op.create_index("ix_tasks_demand", "tasks", [*_DEMAND, "nodes"])


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35), no batch mode.
    op.drop_index("ix_tasks_demand", table_name="tasks")
    op.create_index("ix_tasks_demand", "tasks", _DEMAND)
    op.drop_index("ix_task_ranks_worker_id", table_name="task_ranks")
    op.drop_index("ix_task_ranks_state", table_name="task_ranks")
    op.drop_index("ix_task_ranks_task", table_name="task_ranks")
    op.drop_table("task_ranks")
    op.drop_column("workers", "address")
    op.drop_column("task_logs", "rank")
    op.drop_column("tasks", "nodes")
