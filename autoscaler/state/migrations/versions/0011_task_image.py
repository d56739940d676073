"""container tasks: the image a task runs in and its pull secret's name

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 12:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: every task before this revision runs on the machine itself.
    op.add_column("tasks", sa.Column("image", sa.String(512), nullable=True))
    op.add_column("tasks", sa.Column("image_pull_secret", sa.String(128), nullable=True))


def downgrade() -> None:
    op.drop_column("tasks", "image_pull_secret")
    op.drop_column("tasks", "image")
