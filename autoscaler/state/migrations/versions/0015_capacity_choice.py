"""Tasks say what they survive and how long they run: checkpoints, expected_runtime_s,
command_key, runtime_estimate and runtime_class_s on tasks, and an index to find
earlier runs of the same work; the demand covering index gains the run-time class and
checkpoints (the snapshot groups by them)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01 16:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

# ix_tasks_demand (0014) around the two new columns, in the snapshot query's order.
_DEMAND_HEAD = ["state", "unschedulable_reason", "queue", "team", "gpus", "gpu_type", "priority", "cpus", "memory_mb"]
_DEMAND_TAIL = ["end_reason", "sort_key"]


def upgrade() -> None:
    # Nullable, no default: a task from before this revision declared nothing (NULL:
    # restarts from zero, run time from the prior). Plain ALTER TABLE, no rebuild.
    op.add_column("tasks", sa.Column("checkpoints", sa.String(32), nullable=True))
    op.add_column("tasks", sa.Column("expected_runtime_s", sa.Float(), nullable=True))
    op.add_column("tasks", sa.Column("command_key", sa.String(64), nullable=True))
    op.add_column("tasks", sa.Column("runtime_estimate", sa.JSON(none_as_null=True), nullable=True))
    op.add_column("tasks", sa.Column("runtime_class_s", sa.Float(), nullable=True))
    op.create_index("ix_tasks_history", "tasks", ["team", "queue", "command_key", "state"])
    op.drop_index("ix_tasks_demand", table_name="tasks")
    op.create_index("ix_tasks_demand", "tasks", [*_DEMAND_HEAD, "runtime_class_s", "checkpoints", *_DEMAND_TAIL])


def downgrade() -> None:
    op.drop_index("ix_tasks_demand", table_name="tasks")
    op.create_index("ix_tasks_demand", "tasks", [*_DEMAND_HEAD, *_DEMAND_TAIL])
    op.drop_index("ix_tasks_history", table_name="tasks")
    for name in ("runtime_class_s", "runtime_estimate", "command_key", "expected_runtime_s", "checkpoints"):
        op.drop_column("tasks", name)
