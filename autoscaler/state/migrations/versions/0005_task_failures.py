"""tasks.failures and tasks.retry_on_exit_codes: failed attempts are retried

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not batch mode: on SQLite a batch rebuild drops and recreates
# `tasks`, and the ON DELETE CASCADE of task_events/task_logs would empty them.
# (ADD COLUMN with a constant default and DROP COLUMN need SQLite >= 3.35.)


def upgrade() -> None:
    op.add_column("tasks", sa.Column("failures", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("tasks", sa.Column("retry_on_exit_codes", sa.JSON(), nullable=True))
    # Before this revision a failed attempt was never retried, so a task that ended
    # failed by its own exit, timeout or start failure failed exactly once.
    op.execute(
        "UPDATE tasks SET failures = 1 "
        "WHERE state = 'failed' AND end_reason IN ('exit_code', 'timeout', 'start_failed')"
    )


def downgrade() -> None:
    op.drop_column("tasks", "retry_on_exit_codes")
    op.drop_column("tasks", "failures")
