"""Alembic environment: runs against the engine handed over in `config.attributes`."""

from __future__ import annotations

from alembic import context

from autoscaler.state.models import Base

engine = context.config.attributes["engine"]
with engine.connect() as connection:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
