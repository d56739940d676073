"""SQLite, the embedded default: WAL mode, a busy timeout, and one writer at a time
(BEGIN IMMEDIATE), so a second writer waits instead of failing with 'database is locked'."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import text

from autoscaler.state.db import make_engine, session_factory, transaction, upgrade
from autoscaler.state.models import QueueRow


def test_wal_and_busy_timeout(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.connect() as c:
        assert c.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert int(c.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0) >= 5000
        assert int(c.exec_driver_sql("PRAGMA foreign_keys").scalar() or 0) == 1
    engine.dispose()


def test_second_writer_waits_for_the_first(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'a.db'}")
    upgrade(engine)
    sessions = session_factory(engine)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    holding = threading.Event()
    errors: list[BaseException] = []

    def slow_writer() -> None:
        try:
            with transaction(sessions) as s:
                s.add(QueueRow(name="first", pools=["p"], priority=0, teams=[], created_at=now))
                s.flush()
                holding.set()
                time.sleep(1.0)  # hold the write lock
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=slow_writer)
    t.start()
    assert holding.wait(10)
    started = time.monotonic()
    with transaction(sessions) as s:  # blocks on BEGIN IMMEDIATE until the first commits
        s.add(QueueRow(name="second", pools=["p"], priority=0, teams=[], created_at=now))
    waited = time.monotonic() - started
    t.join()
    assert not errors, errors
    assert waited >= 0.5, f"the second writer did not wait ({waited:.2f} s): no write lock taken"
    with engine.connect() as c:
        names = {r[0] for r in c.execute(text("SELECT name FROM queues"))}
    assert {"first", "second"} <= names
    engine.dispose()
