"""Spot reclaims read from the instance records the ledger already keeps
(autoscaler.ledger.reclaims), on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autoscaler.clock import ManualClock
from autoscaler.config import CapacityConfig
from autoscaler.ledger.reclaims import reclaim_rates, spot_lives
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, InstanceEvent, new_id

# No decay within a test, so the figures are exact; 20 prior hours at 0.24.
CAP = CapacityConfig(reclaim_prior_per_hour=0.24, reclaim_prior_hours=20.0, reclaim_half_life_h=1e6)


def _spot(s, clock: ManualClock, *, hours: float, ended_h_ago: float | None, reclaimed: bool, zone="z1", ct="spot"):
    now = clock.now()
    end = None if ended_h_ago is None else now - timedelta(hours=ended_h_ago)
    start = (end or now) - timedelta(hours=hours)
    inst = Instance(
        id=new_id(),
        request_id=new_id(),
        provider="fake",
        pool="gpu-pool",
        instance_type="g.1",
        capacity_type=ct,
        zone=zone,
        gpus=1,
        state="terminated" if end else "ready",
        hourly_price=0.4,
        created_at=start,
        updated_at=end or now,
        launched_at=start,
        terminated_at=end,
    )
    s.add(inst)
    s.flush()
    if reclaimed:
        s.add(
            InstanceEvent(instance_id=inst.id, at=end or now, from_state="ready", to_state="preempted", reason="spot")
        )


def test_spot_lives_come_from_instance_records(sessions, clock: ManualClock) -> None:
    with transaction(sessions) as s:
        _spot(s, clock, hours=2, ended_h_ago=1, reclaimed=True)
        _spot(s, clock, hours=3, ended_h_ago=5, reclaimed=False)
        _spot(s, clock, hours=1, ended_h_ago=None, reclaimed=False)  # still running
        _spot(s, clock, hours=4, ended_h_ago=1, reclaimed=True, zone="z2")
        _spot(s, clock, hours=9, ended_h_ago=1, reclaimed=False, ct="on_demand")  # never reclaimed: not evidence
    with sessions() as s:
        lives = spot_lives(s, now=clock.now(), half_life_h=1e6)
        rates = reclaim_rates(s, CAP, now=clock.now())
    assert set(lives) == {"spot/g.1/z1", "spot/g.1/z2"}
    z1 = sorted(lives["spot/g.1/z1"], key=lambda x: x.hours)
    assert [round(x.hours, 6) for x in z1] == [1.0, 2.0, 3.0]
    assert [x.reclaimed for x in z1] == [False, True, False]
    assert [round(x.age_h, 6) for x in z1] == [0.0, 1.0, 5.0]
    # (0.24 x 20 + 1) / (20 + 6) and (4.8 + 1) / (20 + 4)
    assert rates["spot/g.1/z1"].rate == pytest.approx(5.8 / 26, rel=1e-4)
    assert rates["spot/g.1/z2"].rate == pytest.approx(5.8 / 24, rel=1e-4)
    assert rates["spot/g.1/z1"].hours == pytest.approx(6.0, rel=1e-4)


def test_evidence_older_than_eight_half_lives_is_not_read(sessions, clock: ManualClock) -> None:
    with transaction(sessions) as s:
        _spot(s, clock, hours=2, ended_h_ago=9 * 24, reclaimed=True)
        _spot(s, clock, hours=2, ended_h_ago=1, reclaimed=True)
    with sessions() as s:
        lives = spot_lives(s, now=clock.now(), half_life_h=24)
    assert len(lives["spot/g.1/z1"]) == 1


def test_no_spot_instance_no_evidence(sessions, clock: ManualClock) -> None:
    with sessions() as s:
        assert reclaim_rates(s, CAP, now=clock.now()) == {}
