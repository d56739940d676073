"""index workers.state

Each cycle selects live and draining workers among every worker that ever registered.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 17:35:00
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workers_state", "workers", ["state"])


def downgrade() -> None:
    op.drop_index("ix_workers_state", table_name="workers")
