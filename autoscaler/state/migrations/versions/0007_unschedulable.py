"""tasks.unschedulable_reason (a queued task no pool of its queue can run)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("tasks", sa.Column("unschedulable_reason", sa.String(500), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE (SQLite >= 3.35): batch mode would rebuild `tasks` and cascade
    # the delete into task_events.
    op.drop_column("tasks", "unschedulable_reason")
