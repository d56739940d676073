"""tasks.secret_env: secret environment values, sealed (AES-GCM) with the server's key

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable, no default: rows from before this revision have no secret env (NULL
    # reads as none). Plain ALTER TABLE, not batch mode (which would rebuild `tasks`).
    op.add_column("tasks", sa.Column("secret_env", sa.JSON(), nullable=True))


def downgrade() -> None:
    # Drops the sealed values: a queued task that had secret env runs without it after
    # a downgrade. Plain ALTER TABLE (SQLite >= 3.35), see 0004.
    op.drop_column("tasks", "secret_env")
