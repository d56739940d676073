"""Alembic migrations, up and down, on SQLite and PostgreSQL, with data in the tables.

- every revision can be stepped down and back up without losing the rows that
  its schema keeps (all revisions but the initial one, whose downgrade drops everything);
- downgrade to base leaves no table behind, and upgrading again works;
- the migrated schema matches the models (no drift a future autogenerate would find).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect, text

from autoscaler.auth.tokens import create_token
from autoscaler.config import parse_config
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as worker_ops
from autoscaler.queueing.queues import sync_from_config
from autoscaler.state.db import alembic_config, downgrade, make_engine, session_factory, transaction, upgrade
from autoscaler.state.models import Base
from tests.conftest import TEST_CONFIG


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """An engine on an EMPTY database (the shared fixtures hand out migrated ones)."""
    if request.param == "sqlite":
        engine = make_engine(f"sqlite:///{tmp_path / 'm.db'}")
        yield engine
        engine.dispose()
        return
    server = request.getfixturevalue("pg_server_url")
    name = f"mig_{abs(hash(request.node.nodeid)) % 10**8}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        c.execute(text(f"CREATE DATABASE {name}"))
    engine = make_engine(server.rsplit("/", 1)[0] + "/" + name)
    yield engine
    engine.dispose()
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


def _fill(engine: Engine) -> None:
    """Data through the domain code, so every table that normal use writes has rows."""
    config = parse_config(TEST_CONFIG, Path("test.yaml"))
    sessions = session_factory(engine)
    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    with transaction(sessions) as s:
        sync_from_config(s, config, now=now)
        _, join = create_token(s, kind="join", now=now, pool="gpu-pool", ttl=timedelta(hours=1))
        create_token(s, kind="team", now=now, team="vision")
        worker, _ = worker_ops.register(
            s,
            join,
            worker_ops.Registration(
                hostname="h",
                instance_id="i-1",
                provider="fake",
                pool="gpu-pool",
                gpus=[{"index": 0, "model": "A10G"}],
                cpus=4,
                memory_mb=1000,
                simulated_gpus=True,
                agent_version="t",
            ),
            now=now,
        )
        for i in range(3):
            task_ops.enqueue(
                s, task_ops.TaskSpec(queue="gpu", command=["echo", str(i)], gpus=1), team="vision", now=now
            )
    with transaction(sessions) as s:
        task = task_ops.lease(s, worker.id, now=now)
        assert task is not None
        task_ops.append_logs(s, worker.id, task.id, [("stdout", "hello")], now=now)


def _counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as c:
        names = [t for t in inspect(c).get_table_names() if t != "alembic_version"]
        return {t: int(c.execute(text(f'SELECT count(*) FROM "{t}"')).scalar_one()) for t in names}


def test_each_revision_steps_down_and_up_with_data(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    _fill(empty_engine)
    before = _counts(empty_engine)
    assert sum(1 for n in before.values() if n > 0) >= 5, before
    script = ScriptDirectory.from_config(alembic_config(empty_engine))
    revisions = list(script.walk_revisions())  # head first
    for rev in revisions:
        if rev.down_revision is None:
            continue  # the initial revision's downgrade drops every table by design
        downgrade(empty_engine, "-1")
        upgrade(empty_engine, rev.revision)
        after = _counts(empty_engine)
        for table, n in before.items():
            assert after.get(table) == n, f"{rev.revision}: {table} had {n} rows, now {after.get(table)}"
    downgrade(empty_engine, "base")
    with empty_engine.connect() as c:
        left = [t for t in inspect(c).get_table_names() if t != "alembic_version"]
    assert left == [], left
    upgrade(empty_engine)
    _fill(empty_engine)  # the schema is whole again


def test_migrated_schema_matches_the_models(empty_engine: Engine) -> None:
    upgrade(empty_engine)
    with empty_engine.connect() as c:
        diff = compare_metadata(MigrationContext.configure(c), Base.metadata)
    assert diff == [], diff
