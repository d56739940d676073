"""tasks.interruptions: attempts ended by a spot reclaim or a drain

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 16:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


# Plain ALTER TABLE, not batch mode: on SQLite a batch rebuild drops and recreates
# `tasks`, and the ON DELETE CASCADE of task_events/task_logs would empty them.
# (ADD COLUMN with a constant default and DROP COLUMN need SQLite >= 3.35.)


def upgrade() -> None:
    op.add_column("tasks", sa.Column("interruptions", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("tasks", "interruptions")
