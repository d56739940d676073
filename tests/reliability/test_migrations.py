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

from autoscaler.auth import security
from autoscaler.auth.sealing import SecretKeys
from autoscaler.auth.tokens import create_token
from autoscaler.config import parse_config
from autoscaler.errors import SecurityNote
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
        task_ops.enqueue(
            s,
            task_ops.TaskSpec(queue="cpu", command=["true"], secret_env={"API_KEY": "k"}),
            team="vision",
            now=now,
            secret_keys=SecretKeys.generate(),
        )
    with transaction(sessions) as s:
        task = task_ops.lease(s, worker.id, now=now)
        assert task is not None
        task_ops.append_logs(s, worker.id, task.id, [("stdout", "hello")], now=now)
        # 0012: a GPU sample of the worker (the attempt above holds its GPU 0).
        worker_ops.heartbeat(
            s,
            worker.id,
            now=now,
            gpu_metrics=[{"index": 0, "utilization_pct": 50.0, "memory_used_mb": 1.0, "memory_total_mb": 2.0}],
            gpu_sample_interval_s=0,
        )
        # 0010: a consumed join token (above) and a recorded security event.
        security.record(
            s, SecurityNote(kind=security.JOIN_REPLAY, detail="test", token_id=join.id, token_kind="join"), now=now
        )


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
        at_rev = _counts(empty_engine)
        downgrade(empty_engine, "-1")
        below = _counts(empty_engine)
        upgrade(empty_engine, rev.revision)
        after = _counts(empty_engine)
        assert set(after) == set(at_rev), f"{rev.revision}: tables differ after down and up"
        for table in below:  # what the older schema keeps survives the round trip, as filled
            assert before[table] == below[table] == after[table], f"{rev.revision}: {table} lost rows"
        downgrade(empty_engine, "-1")  # on to the next older revision
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


def test_0005_adds_failures_and_retry_codes_and_backfills_past_failures(empty_engine: Engine) -> None:
    """0005 up and down with rows in `tasks`: nothing lost, and a task that failed by
    its own exit before 0005 (never retried then) counts exactly one failure."""
    upgrade(empty_engine)
    _fill(empty_engine)
    before = _counts(empty_engine)
    downgrade(empty_engine, "0003")
    with empty_engine.connect() as c:
        columns = {col["name"] for col in inspect(c).get_columns("tasks")}
    assert "failures" not in columns and "retry_on_exit_codes" not in columns
    # Tables made after 0003 (team_admission, task_attempts) are gone; every other row is kept.
    below = _counts(empty_engine)
    assert below == {name: n for name, n in before.items() if name in below}
    with empty_engine.begin() as c:
        ids = [r[0] for r in c.execute(text("SELECT id FROM tasks WHERE state = 'queued' ORDER BY id"))]
        assert len(ids) >= 2
        c.execute(text("UPDATE tasks SET state = 'failed', end_reason = 'exit_code' WHERE id = :id"), {"id": ids[0]})
        c.execute(
            text("UPDATE tasks SET state = 'failed', end_reason = 'max_interruptions' WHERE id = :id"), {"id": ids[1]}
        )
    upgrade(empty_engine, "0005")
    # Tables made after 0005 (task_attempts by 0006, the alert_* tables by 0009) are not there yet.
    at_0005 = _counts(empty_engine)
    assert at_0005 == {name: n for name, n in before.items() if name in at_0005}
    with empty_engine.connect() as c:
        rows = {r[0]: (r[1], r[2]) for r in c.execute(text("SELECT id, failures, retry_on_exit_codes FROM tasks"))}
    assert rows[ids[0]] == (1, None) and rows[ids[1]] == (0, None)
    assert all(f == 0 for tid, (f, _) in rows.items() if tid != ids[0])
    # The domain code works on the upgraded schema (at head: the models have later
    # revisions' columns too): a retry list round-trips.
    upgrade(empty_engine)
    sessions = session_factory(empty_engine)
    with transaction(sessions) as s:
        task = task_ops.enqueue(
            s,
            task_ops.TaskSpec(queue="gpu", command=["x"], retry_on_exit_codes=[137, 1]),
            team="vision",
            now=datetime(2026, 3, 10, 12, 0, tzinfo=UTC),
        )
        tid = task.id
    with sessions() as s:
        got = s.get(task_ops.Task, tid)
        assert got is not None and got.retry_on_exit_codes == [1, 137] and got.failures == 0


def test_0006_keeps_old_segments_as_unused_and_opens_attempts_of_running_tasks(empty_engine: Engine) -> None:
    """Segments written before exact attribution charged the whole machine to the
    launcher: they become `unused` rows with their machine-hours; a task holding GPUs
    at upgrade time gets an open attempt. Down again, the segments keep their rows."""
    upgrade(empty_engine)
    _fill(empty_engine)  # one leased task (through today's code, so at the head)
    downgrade(empty_engine, "0003")
    at = "2026-03-10 12:00:00"
    with empty_engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO spend_records (instance_id, team, pool, provider, region, instance_type, capacity_type,"
                ' start, "end", hourly_price, cost_usd) VALUES'
                " ('i-1', 'vision', 'gpu-pool', 'fake', NULL, 'g.1', 'spot', :at, :at, 2.0, 5.0)"
            ),
            {"at": at},
        )
    upgrade(empty_engine, "0006")
    with empty_engine.connect() as c:
        row = c.execute(text("SELECT kind, hours, gpu_hours, cost_usd FROM spend_records")).one()
        attempts = c.execute(text("SELECT task_id, attempt, ended_at, cost_usd FROM task_attempts")).all()
        leased = c.execute(text("SELECT id, attempts FROM tasks WHERE state = 'leased'")).all()
    assert (row.kind, row.hours, row.gpu_hours, row.cost_usd) == ("unused", 2.5, 0.0, 5.0)
    assert [(a.task_id, a.attempt, a.ended_at, a.cost_usd) for a in attempts] == [
        (t.id, t.attempts, None, 0.0) for t in leased
    ]
    downgrade(empty_engine, "0003")
    with empty_engine.connect() as c:
        names = inspect(c).get_table_names()
        columns = {col["name"] for col in inspect(c).get_columns("spend_records")}
        assert int(c.execute(text("SELECT count(*) FROM spend_records")).scalar_one()) == 1
    assert "task_attempts" not in names and not {"kind", "hours", "gpu_hours"} & columns
    upgrade(empty_engine)


def test_0008_adds_and_drops_the_sealed_secret_env_column(empty_engine: Engine) -> None:
    """0008 is a plain ADD/DROP COLUMN: the tasks (and their events) outlive a step
    down to 0007 and back; the sealed values do not (documented), and an old row
    reads as having no secret env."""
    upgrade(empty_engine)
    _fill(empty_engine)

    def columns() -> set[str]:
        with empty_engine.connect() as c:
            return {col["name"] for col in inspect(c).get_columns("tasks")}

    def sealed() -> list[Any]:
        with empty_engine.connect() as c:
            return [r[0] for r in c.execute(text("SELECT secret_env FROM tasks WHERE queue = 'cpu'"))]

    assert "secret_env" in columns()
    assert len(sealed()) == 1 and "v1." in str(sealed()[0]) and "'k'" not in str(sealed()[0])
    before = _counts(empty_engine)
    downgrade(empty_engine, "0007")
    assert "secret_env" not in columns()
    # Tables of later revisions (alerts, security events) are gone below them; the rest keep their rows.
    at_0007 = _counts(empty_engine)
    assert at_0007 == {name: n for name, n in before.items() if name in at_0007}
    upgrade(empty_engine, "0008")
    assert "secret_env" in columns() and sealed() == [None]
    assert _counts(empty_engine) == at_0007
