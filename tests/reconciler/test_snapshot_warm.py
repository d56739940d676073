"""The snapshot's recent task starts: what the adaptive warm pool is sized by.

Real databases (SQLite and PostgreSQL). Attempts are counted by the kind of machine
they started on (the worker's pool and GPUs), only inside the window, and the planner
input carries them with the config's boot time.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig
from autoscaler.policy.schema import Decision
from autoscaler.reconciler.snapshot import observe, recent_starts
from autoscaler.state.db import transaction
from autoscaler.state.models import TaskAttempt, Worker

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _worker(wid: str, pool: str, gpus: int) -> dict[str, object]:
    return dict(
        id=wid,
        hostname=wid,
        instance_id=f"i-{wid}",
        provider="fake",
        pool=pool,
        state="idle",
        gpus=[],
        gpu_count=gpus,
        gpu_metrics=[],
        registered_at=NOW - timedelta(hours=3),
        last_heartbeat=NOW,
    )


def _attempt(n: int, wid: str | None, age_s: float) -> dict[str, object]:
    return dict(task_id=f"t{n}", attempt=1, team="vision", worker_id=wid, started_at=NOW - timedelta(seconds=age_s))


def test_starts_are_counted_by_machine_kind_inside_the_window(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    pool = config.pools[0].name
    with transaction(sessions) as s:
        s.execute(insert(Worker), [_worker("w1", pool, 1), _worker("w1b", pool, 1), _worker("w4", pool, 4)])
        s.execute(
            insert(TaskAttempt),
            [
                _attempt(1, "w1", 10),
                _attempt(2, "w1b", 3599),
                _attempt(3, "w1", 3601),  # before the window
                _attempt(4, "w4", 60),
                _attempt(5, None, 60),  # never reached a worker
                _attempt(6, "w1", -5),  # after `now` (a clock ahead): not yet
            ],
        )
    with sessions() as s:
        assert recent_starts(s, NOW) == {(pool, 1): 2, (pool, 4): 1}
        snap = observe(s, config, now=NOW, pool_state={})
    warm = snap.plan_input(Decision()).warm
    assert warm is not None and warm.starts == {(pool, 1): 2, (pool, 4): 1}
    assert warm.boot_s == config.capacity.boot_s


def test_without_an_adaptive_pool_the_starts_are_not_read(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    fixed = config.model_copy(update={"pools": [p.model_copy(update={"warm_pool": "fixed"}) for p in config.pools]})
    with sessions() as s:
        assert observe(s, fixed, now=NOW, pool_state={}).warm is None
