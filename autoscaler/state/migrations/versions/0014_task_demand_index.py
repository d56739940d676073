"""index the snapshot's demand query: tasks by state and shape, covering

Each cycle groups the queued tasks by shape (queue, team, GPUs, type, priority, CPUs,
memory, end reason) and takes the oldest sort key of each group. With the columns in
the grouping's order after the filter's, SQLite reads the groups straight off the
index, with no table lookup and no sort.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01 16:00:00
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

COLUMNS = [
    "state",
    "unschedulable_reason",
    "queue",
    "team",
    "gpus",
    "gpu_type",
    "priority",
    "cpus",
    "memory_mb",
    "end_reason",
    "sort_key",
]


def upgrade() -> None:
    op.create_index("ix_tasks_demand", "tasks", COLUMNS)


def downgrade() -> None:
    op.drop_index("ix_tasks_demand", table_name="tasks")
