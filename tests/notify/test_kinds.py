"""The alerts besides budget thresholds, from a live reconcile loop: a hard budget
freezing a team on its forecast, a pool in launch backoff for longer than
`pool_backoff_minutes`, a machine that never registered, the policy failing safe.
Each is recorded once (per period, per episode or per machine)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.policy.schema import EvaluationResult, PolicyInput
from autoscaler.policy.service import PolicyService
from autoscaler.state.models import AlertDelivery, AlertEvent
from providers.base import CapacityError
from tests.conftest import TEST_CONFIG
from tests.reconciler.harness import make_rig

NOTIFY = """
notifications:
  channels:
    - {name: ops, type: webhook, url: 'http://127.0.0.1:9/ops'}
    - {name: finops, type: slack, url: 'http://127.0.0.1:9/finops'}
  routes:
    - {channels: [finops], kinds: [budget, budget_freeze, budget_drain]}
    - {channels: [ops], teams: ['-']}
  pool_backoff_minutes: 2
"""


def _events(sessions: sessionmaker[Session]) -> list[tuple[str, str, list[str]]]:
    with sessions() as s:
        out = []
        for e in s.scalars(select(AlertEvent).order_by(AlertEvent.id)):
            channels = sorted(s.scalars(select(AlertDelivery.channel).where(AlertDelivery.event_id == e.id)))
            out.append((e.kind, e.key, channels))
        return out


def test_pool_backoff_and_a_machine_that_never_registered(
    sqlite_sessions: sessionmaker[Session], clock: ManualClock, shipped_policy: PolicyService
) -> None:
    config = parse_config(TEST_CONFIG + NOTIFY, Path("t.yaml"))
    rig = make_rig(sqlite_sessions, config, clock, shipped_policy)
    r = rig.reconciler()
    rig.enqueue("vision")
    r.run_cycle()
    (inst,) = rig.instances()
    assert inst.state == "booting"
    # Nothing registers on it; past the boot timeout it is terminated, and that is an alert.
    rig.fakes["gpu-pool"].fail_when(lambda _: True, CapacityError("no capacity anywhere"))
    for _ in range(20):
        clock.advance(60)
        r.run_cycle()
    kinds = [k for k, _, _ in _events(rig.sessions)]
    assert kinds.count("never_registered") == 1
    (never,) = [e for e in _events(rig.sessions) if e[0] == "never_registered"]
    assert never[1] == f"never_registered/{inst.id}" and never[2] == ["ops"]  # a fleet alert: the ops route
    # The relaunch keeps failing for capacity: one alert for the episode, after 2 minutes.
    backoff = [e for e in _events(rig.sessions) if e[0] == "pool_backoff"]
    assert len(backoff) == 1 and backoff[0][1].startswith("pool_backoff/gpu-pool/") and backoff[0][2] == ["ops"]
    with rig.sessions() as s:
        event = s.scalars(select(AlertEvent).where(AlertEvent.kind == "pool_backoff")).one()
        assert "gpu-pool" in event.message and "launch backoff" in event.message
    # A restarted reconciler sees the same episode in the database: nothing new.
    r = rig.reconciler()
    for _ in range(3):
        clock.advance(15)
        r.run_cycle()
    # (its in-memory backoff is gone, but the next failure is within the grace: the same episode)
    assert len([e for e in _events(rig.sessions) if e[0] == "pool_backoff"]) == 1
    assert [k for k, _, _ in _events(rig.sessions)].count("never_registered") == 1


class Broken:
    """A policy engine that cannot evaluate (until fixed)."""

    def __init__(self, inner: PolicyService) -> None:
        self.inner = inner
        self.broken = True

    def evaluate(self, pin: PolicyInput) -> EvaluationResult:
        if self.broken:
            raise RuntimeError("bundle failed to compile")
        return self.inner.evaluate(pin)

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def test_fail_safe_alerts_once_per_episode(
    sqlite_sessions: sessionmaker[Session], clock: ManualClock, shipped_policy: PolicyService
) -> None:
    config = parse_config(TEST_CONFIG + NOTIFY, Path("t.yaml"))
    engine = Broken(shipped_policy)
    rig = make_rig(sqlite_sessions, config, clock, engine)  # type: ignore[arg-type]
    r = rig.reconciler()
    for _ in range(5):
        r.run_cycle()
        clock.advance(15)
    (fail,) = [e for e in _events(rig.sessions) if e[0] == "fail_safe"]
    assert fail[2] == ["ops"]
    with rig.sessions() as s:
        msg = s.scalars(select(AlertEvent.message).where(AlertEvent.kind == "fail_safe")).one()
    assert "bundle failed to compile" in msg and "no team may scale up" in msg
    # Fixed, then broken again well after: a second episode, a second alert.
    engine.broken = False
    for _ in range(3):
        r.run_cycle()
        clock.advance(300)
    engine.broken = True
    r.run_cycle()
    r.run_cycle()
    assert len([e for e in _events(rig.sessions) if e[0] == "fail_safe"]) == 2


def test_hard_budget_freeze_on_the_forecast_and_the_forecast_threshold(
    sqlite_sessions: sessionmaker[Session], clock: ManualClock, tmp_path: Path
) -> None:
    from tests.notify.test_live_loop import HARD, _spend_to
    from tests.reconciler.harness import policy_service

    policy = policy_service(tmp_path, HARD)
    try:
        config = parse_config(TEST_CONFIG + NOTIFY, Path("t.yaml"))
        rig = make_rig(sqlite_sessions, config, clock, policy)
        r = rig.reconciler()
        task = rig.enqueue("vision")
        r.run_cycle()
        (inst,) = rig.instances()
        wid = rig.register(rig.instance(inst.id))
        r.run_cycle()
        assert rig.lease(wid) == task
        # 800 USD spent; the machine's burn over the rest of March forecasts past 100 %.
        _spend_to(rig, 800)
        for _ in range(3):
            clock.advance(15)
            rig.heartbeat(wid)
            r.run_cycle()
        events = _events(rig.sessions)
        kinds = sorted(k for k, _, _ in events)
        assert kinds == ["budget", "budget", "budget_freeze"], events
        keys = sorted(key for _, key, _ in events)
        assert keys == [
            "budget/vision/2026-03/actual/80",
            "budget/vision/2026-03/forecast/100",
            "budget_freeze/vision/2026-03",
        ]
        assert all(channels == ["finops"] for _, _, channels in events)
    finally:
        policy.close()


def test_a_failure_working_out_alerts_does_not_cost_the_cycle_its_record(
    sqlite_sessions: sessionmaker[Session],
    clock: ManualClock,
    shipped_policy: PolicyService,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import autoscaler.reconciler.record as record_mod
    from autoscaler.state.models import DecisionRecord

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(record_mod, "record_due", boom)
    rig = make_rig(sqlite_sessions, parse_config(TEST_CONFIG + NOTIFY, Path("t.yaml")), clock, shipped_policy)
    res = rig.reconciler().run_cycle()
    with rig.sessions() as s:
        assert s.get(DecisionRecord, res.decision_id) is not None
