"""right-sizing: instances.smaller_machines

The smaller machines of an instance's pool that a GPU task waits for rather than take
the whole instance while nothing runs on it (`autoscaler.admission.right_size`),
recorded at launch. Instances from before this revision have none (NULL): no rule.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03 13:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.add_column(sa.Column("smaller_machines", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("instances") as batch:
        batch.drop_column("smaller_machines")
