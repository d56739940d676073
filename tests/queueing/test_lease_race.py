"""Concurrent leasers never get the same task (PostgreSQL: FOR UPDATE SKIP LOCKED;
SQLite: serialised write transactions)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import func, select

from autoscaler.clock import SystemClock
from autoscaler.queueing import tasks as ops
from autoscaler.state.db import make_engine, session_factory, transaction
from autoscaler.state.models import TaskEvent
from tests.conftest import make_context
from tests.queueing.helpers import add_worker


def _race(db_url: str, config, n_tasks: int, n_leasers: int) -> tuple[Counter[str], int]:
    engine = make_engine(db_url, **({"pool_size": n_leasers + 2} if db_url.startswith("postgresql") else {}))
    sessions = session_factory(engine)
    ctx = make_context(config, sessions, SystemClock())
    clock = ctx.clock
    with transaction(sessions) as s:
        for i in range(n_tasks):
            ops.enqueue(s, ops.TaskSpec(queue="cpu", command=["echo", str(i)]), team="vision", now=clock.now())
    workers = [add_worker(sessions, clock, pool="cpu-pool", gpus=0) for _ in range(n_leasers)]  # type: ignore[arg-type]
    leased: list[str] = []
    lock = threading.Lock()
    start = threading.Barrier(n_leasers)
    errors: list[BaseException] = []

    def leaser(worker_id: str) -> None:
        try:
            start.wait()
            while True:
                with transaction(sessions) as s:
                    task = ops.lease(s, worker_id, now=clock.now())
                    if task is None:
                        return
                    tid = task.id
                with transaction(sessions) as s:
                    ops.finish(s, worker_id, tid, now=clock.now(), reason="exit", exit_code=0)
                with lock:
                    leased.append(tid)
        except BaseException as exc:  # surfaced below; a thread must not die silently
            errors.append(exc)

    threads = [threading.Thread(target=leaser, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors[:3]
    with sessions() as s:
        lease_events = s.scalar(select(func.count()).select_from(TaskEvent).where(TaskEvent.to_state == "leased"))
    engine.dispose()
    return Counter(leased), int(lease_events or 0)


# Twenty leasers contend from the first lease to the last whatever the number of tasks;
# more tasks only make the race longer. `make test` runs 300 (each leaser some 15
# leases), `make reliability` the thousand.
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "n_tasks", [pytest.param(300, id="300"), pytest.param(1000, id="1000", marks=pytest.mark.slow)]
)
def test_twenty_leasers_postgres(pg_url, config, n_tasks: int) -> None:
    counts, lease_events = _race(pg_url, config, n_tasks=n_tasks, n_leasers=20)
    assert len(counts) == n_tasks
    assert max(counts.values()) == 1
    assert lease_events == n_tasks


def test_concurrent_leasers_sqlite(sqlite_url, config) -> None:
    counts, lease_events = _race(sqlite_url, config, n_tasks=200, n_leasers=8)
    assert len(counts) == 200 and max(counts.values()) == 1 and lease_events == 200
