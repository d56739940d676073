"""index task attempts by start: the warm pool's recent starts

Each cycle counts the task attempts started in the last hour by the kind of machine
they started on (autoscaler.planner.warm_pool); the index makes that a range read of
the last hour, not a scan of every attempt ever made.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 20:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_task_attempts_started_at", "task_attempts", ["started_at"])


def downgrade() -> None:
    op.drop_index("ix_task_attempts_started_at", table_name="task_attempts")
