"""Launches and terminations run on the executor's threads and report back: a cycle
never waits on a cloud operation."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.policy.service import PolicyService
from autoscaler.queueing import tasks as task_ops
from autoscaler.reconciler.cycle import Reconciler
from autoscaler.reconciler.executor import ThreadedExecutor
from autoscaler.state.db import transaction
from autoscaler.state.models import Task
from tests.conftest import TEST_CONFIG
from tests.reconciler.harness import make_rig

OP_S = 5.0  # seconds per provider operation (a cloud VM create)
N = 100


def test_a_cycle_with_100_launches_on_a_slow_fake_returns_at_once(
    sqlite_sessions: sessionmaker[Session], clock: ManualClock, shipped_policy: PolicyService
) -> None:
    config = parse_config(TEST_CONFIG.replace("max_instances: 4", f"max_instances: {N}"), Path("test.yaml"))
    rig = make_rig(sqlite_sessions, config, clock, shipped_policy)
    fake = rig.fakes["gpu-pool"]
    fake.op_delay_s = OP_S
    executor = ThreadedExecutor(concurrency=128)
    r = Reconciler(rig.sessions, config, clock, dict(rig.fakes), rig.policy, executor=executor)
    try:
        for _ in range(N):
            rig.enqueue()
        t0 = time.perf_counter()
        first = r.run_cycle()
        took = time.perf_counter() - t0
        assert took < 1.0, f"the cycle waited on the provider: {took:.2f} s, {first.timings_ms}"
        rows = rig.instances()
        assert len(rows) == N and {i.state for i in rows} == {"launching"}, "intents committed before the calls"
        assert first.launched == []

        assert executor.wait_idle(3 * OP_S), "the calls did not all finish within a few operation times"
        waited = time.perf_counter() - t0
        assert len(fake.live()) == N
        assert waited < 3 * OP_S, f"{N} launches took {waited:.1f} s at {OP_S} s each"

        # The next cycle applies the outcomes (it never re-launches what is in flight or done).
        t1 = time.perf_counter()
        second = r.run_cycle()
        assert time.perf_counter() - t1 < OP_S, "applying the outcomes waits on nothing"
        assert sorted(second.launched) == sorted(i.id for i in rows)
        assert {i.state for i in rig.instances()} == {"booting"}
        launches = fake.calls_of("launch")
        assert len(launches) == N and len({c.arg.request_id for c in launches}) == N, "no duplicate call"
        assert len({i.request.request_id for i in fake.live()}) == N, "no duplicate instance"
        assert {i.provider_instance_id for i in rig.instances()} == {i.instance_id for i in fake.live()}
    finally:
        executor.close()


def test_a_launch_that_finishes_after_its_row_was_given_up_is_terminated(
    sqlite_sessions: sessionmaker[Session], clock: ManualClock, shipped_policy: PolicyService
) -> None:
    rig = make_rig(sqlite_sessions, parse_config(TEST_CONFIG, Path("test.yaml")), clock, shipped_policy)
    fake = rig.fakes["gpu-pool"]
    fake.op_delay_s = 0.5
    executor = ThreadedExecutor()
    r = Reconciler(rig.sessions, rig.config, clock, dict(rig.fakes), rig.policy, executor=executor)
    try:
        task = rig.enqueue()
        first = r.run_cycle()
        (row,) = rig.instances()
        assert row.state == "launching" and executor.launching() == {row.id}
        # Given up while the call is in flight (as a boot timeout or a budget would).
        with transaction(rig.sessions) as s:
            t = s.get(Task, task)
            assert t is not None
            task_ops.cancel(s, t, now=clock.now())
        r._terminate(row.id, "given up (test)", None, clock.now(), first)
        assert rig.instance(row.id).state == "terminated"
        # Its outcome is not yet applied: still counted in flight, never resubmitted.
        assert executor.wait_idle(5) and executor.launching() == {row.id}
        r.run_cycle()
        assert executor.wait_idle(5)
        assert fake.live() == [], "the instance it started was terminated"
        assert rig.instance(row.id).provider_instance_id is not None
        assert len(fake.calls_of("launch")) == 1
    finally:
        executor.close()
