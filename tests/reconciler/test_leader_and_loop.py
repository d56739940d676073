"""Leader election on a real PostgreSQL, and the debounced waker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, text

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from autoscaler.policy.service import PolicyService
from autoscaler.reconciler.leader import LeaderLock
from autoscaler.reconciler.loop import JOB_ID, ReconcileLoop, next_run_after_wake
from autoscaler.state.db import make_engine, session_factory
from tests.reconciler.harness import make_rig


def test_two_reconcilers_one_acts_and_standby_takes_over_when_leader_dies(
    pg_url: str, config: AutoscalerConfig, clock: ManualClock, shipped_policy: PolicyService
) -> None:
    engine_a, engine_b = make_engine(pg_url), make_engine(pg_url)
    rig = make_rig(session_factory(engine_a), config, clock, shipped_policy)
    fake = rig.fakes["gpu-pool"]
    loop_a = ReconcileLoop(rig.reconciler(), LeaderLock(engine_a), clock, debounce_s=1)
    rig_b = make_rig(session_factory(engine_b), config, clock, shipped_policy)
    rig_b.fakes = rig.fakes  # the same cloud
    loop_b = ReconcileLoop(rig_b.reconciler(), LeaderLock(engine_b), clock, debounce_s=1)
    try:
        rig.enqueue()
        assert loop_a.tick() is not None
        assert loop_b.tick() is None  # standby: acts on nothing
        assert len(fake.calls_of("launch")) == 1

        # The leader's process dies: PostgreSQL ends its session and frees the lock.
        pid = loop_a.lock.backend_pid()
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as c:
            c.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
        admin.dispose()
        rig.enqueue()
        clock.advance(15)
        assert loop_b.tick() is not None  # the standby's next interval
        assert len(fake.calls_of("launch")) == 2
        assert loop_a.tick() is None  # the old leader finds its session gone and stands by
        assert len(fake.calls_of("launch")) == 2
    finally:
        loop_a.lock.release()
        loop_b.lock.release()
        engine_a.dispose()
        engine_b.dispose()


def test_sqlite_is_always_leader(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    assert LeaderLock(engine).acquire() and LeaderLock(engine).acquire()
    engine.dispose()


T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def test_wake_pulls_the_next_run_forward_but_never_back() -> None:
    assert next_run_after_wake(T0 + timedelta(seconds=15), T0, 1.0) == T0 + timedelta(seconds=1)
    assert next_run_after_wake(T0 + timedelta(seconds=0.5), T0, 1.0) == T0 + timedelta(seconds=0.5)
    assert next_run_after_wake(None, T0, 1.0) == T0 + timedelta(seconds=1)


class _Job:
    def __init__(self, at: datetime) -> None:
        self.next_run_time = at


class _Scheduler:
    def __init__(self, at: datetime) -> None:
        self.job = _Job(at)
        self.modified = 0

    def get_job(self, job_id: str) -> Any:
        return self.job if job_id == JOB_ID else None

    def modify_job(self, job_id: str, **changes: Any) -> None:
        self.modified += 1
        self.job.next_run_time = changes["next_run_time"]


def test_a_burst_of_wakes_costs_one_early_run(sqlite_url: str, config: AutoscalerConfig) -> None:
    clock = ManualClock(T0)
    engine = make_engine(sqlite_url)
    loop = ReconcileLoop(None, LeaderLock(engine), clock, debounce_s=1.0)  # type: ignore[arg-type]
    sched = _Scheduler(T0 + timedelta(seconds=15))
    loop.scheduler = sched
    for _ in range(50):
        loop.wake("enqueue")
        clock.advance(0.01)
    assert sched.job.next_run_time == T0 + timedelta(seconds=1)
    assert sched.modified == 1
    engine.dispose()
