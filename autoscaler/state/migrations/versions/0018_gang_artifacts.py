"""gang artifacts: artifacts.rank and artifacts.generation

A multi-node task's ranks each leave their own outputs and checkpoints (`rank`), and a
gang's checkpoints are kept per generation (the k-th checkpoint point of an attempt's
schedule) so the next attempt restores one consistent set: the unique key becomes
(task, name, attempt, generation). Rows from before this revision are single-node
artifacts: rank NULL, generation 0.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01 22:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Batch mode: SQLite cannot change a unique constraint in place (the table is rebuilt).
    with op.batch_alter_table("artifacts") as batch:
        batch.add_column(sa.Column("rank", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("generation", sa.Integer(), nullable=False, server_default="0"))
        batch.drop_constraint("uq_artifacts_task_name_attempt", type_="unique")
        batch.create_unique_constraint(
            "uq_artifacts_task_name_attempt_generation", ["task_id", "name", "attempt", "generation"]
        )


def downgrade() -> None:
    # Keeps the newest generation of each (task, name, attempt): the old key allows one.
    op.execute(
        "DELETE FROM artifacts WHERE EXISTS (SELECT 1 FROM artifacts AS newer WHERE newer.task_id = artifacts.task_id "
        "AND newer.name = artifacts.name AND newer.attempt = artifacts.attempt "
        "AND newer.generation > artifacts.generation)"
    )
    with op.batch_alter_table("artifacts") as batch:
        batch.drop_constraint("uq_artifacts_task_name_attempt_generation", type_="unique")
        batch.create_unique_constraint("uq_artifacts_task_name_attempt", ["task_id", "name", "attempt"])
        batch.drop_column("generation")
        batch.drop_column("rank")
