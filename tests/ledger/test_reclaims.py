"""Spot reclaims read from the instance records the ledger already keeps
(autoscaler.ledger.reclaims), on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autoscaler.clock import ManualClock
from autoscaler.config import CapacityConfig
from autoscaler.ledger.reclaims import reclaim_rates, spot_lives
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, InstanceEvent
from tests.spot_lives import add_spot_life

# No decay within a test, so the figures are exact; 20 prior hours at 0.24.
CAP = CapacityConfig(reclaim_prior_per_hour=0.24, reclaim_prior_hours=20.0, reclaim_half_life_h=1e6)


def test_spot_lives_come_from_instance_records(sessions, clock: ManualClock) -> None:
    with transaction(sessions) as s:
        add_spot_life(s, clock, hours=2, ended_h_ago=1, reclaimed=True)
        add_spot_life(s, clock, hours=3, ended_h_ago=5, reclaimed=False)
        add_spot_life(s, clock, hours=1, ended_h_ago=None, reclaimed=False)  # still running
        add_spot_life(s, clock, hours=4, ended_h_ago=1, reclaimed=True, zone="z2")
        add_spot_life(
            s, clock, hours=9, ended_h_ago=1, reclaimed=False, ct="on_demand"
        )  # never reclaimed: not evidence
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
        add_spot_life(s, clock, hours=2, ended_h_ago=9 * 24, reclaimed=True)
        add_spot_life(s, clock, hours=2, ended_h_ago=1, reclaimed=True)
    with sessions() as s:
        lives = spot_lives(s, now=clock.now(), half_life_h=24)
    assert len(lives["spot/g.1/z1"]) == 1


def test_no_spot_instance_no_evidence(sessions, clock: ManualClock) -> None:
    with sessions() as s:
        assert reclaim_rates(s, CAP, now=clock.now()) == {}


# ------------------------------------------------------------ the loop's running copy

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from autoscaler.ledger.reclaims import ReclaimEvidence, reclaim_prior  # noqa: E402

# One step of a history: after `dt_h` hours, launch a spot instance in a zone, give one
# a spot notice (reclaimed, still running), end one (reclaimed or not), or refresh the
# loop's copy and compare it with a full read.
_STEP = st.tuples(
    st.floats(min_value=0.0, max_value=30.0),
    st.sampled_from(["launch", "end", "notice", "reclaim", "refresh"]),
    st.sampled_from(["z1", "z2", "z3"]),
)


def _assert_same(incremental, full) -> None:
    assert set(incremental) == set(full)
    for key, est in full.items():
        got = incremental[key]
        assert got.rate == pytest.approx(est.rate, rel=1e-9, abs=1e-12), key
        assert got.hours == pytest.approx(est.hours, rel=1e-9, abs=1e-9), key
        assert got.reclaims == pytest.approx(est.reclaims, rel=1e-9, abs=1e-9), key


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(_STEP, min_size=1, max_size=40), half_life_h=st.sampled_from([2.0, 24.0, 336.0]))
def test_the_loops_running_copy_matches_a_full_read(sessions, clock: ManualClock, steps, half_life_h) -> None:
    """Decay, the eight-half-life cutoff, instances ending between refreshes and a
    late-written termination: the incremental estimates equal `reclaim_rates`'s."""
    cap = CapacityConfig(reclaim_prior_per_hour=0.24, reclaim_prior_hours=20.0, reclaim_half_life_h=half_life_h)
    with transaction(sessions) as s:  # each example starts from an empty fleet
        s.query(InstanceEvent).delete()
        s.query(Instance).delete()
    evidence = ReclaimEvidence(reclaim_prior(cap))
    running: list[str] = []
    for dt_h, action, zone in steps:
        clock.advance(dt_h * 3600.0)
        now = clock.now()
        with transaction(sessions) as s:
            if action == "launch":
                running.append(add_spot_life(s, clock, hours=0.0, ended_h_ago=None, reclaimed=False, zone=zone))
            elif action == "notice" and running:  # reclaimed, not yet terminated: already evidence
                s.add(
                    InstanceEvent(
                        instance_id=running[-1], at=now, from_state="ready", to_state="preempted", reason="spot"
                    )
                )
            elif action in ("end", "reclaim") and running:
                inst = s.get(Instance, running.pop(0))
                # written late: the termination is dated a little before this write
                inst.terminated_at = now - timedelta(minutes=20)
                inst.state = "terminated"
                if action == "reclaim":
                    s.add(
                        InstanceEvent(
                            instance_id=inst.id,
                            at=inst.terminated_at,
                            from_state="ready",
                            to_state="preempted",
                            reason="spot",
                        )
                    )
        if action == "refresh":
            with sessions() as s:
                _assert_same(evidence.refresh(s, now), reclaim_rates(s, cap, now=now))
    with sessions() as s:
        _assert_same(evidence.refresh(s, clock.now()), reclaim_rates(s, cap, now=clock.now()))


def test_the_running_copy_forgets_what_a_full_read_no_longer_reads(sessions, clock: ManualClock) -> None:
    """A life that ended more than eight half-lives ago leaves the sums; the origin of
    the weights moves on over hundreds of half-lives without overflowing."""
    cap = CapacityConfig(reclaim_prior_per_hour=0.24, reclaim_prior_hours=20.0, reclaim_half_life_h=1.0)
    evidence = ReclaimEvidence(reclaim_prior(cap))
    with transaction(sessions) as s:
        add_spot_life(s, clock, hours=5.0, ended_h_ago=0.5, reclaimed=True)
        add_spot_life(s, clock, hours=3.0, ended_h_ago=0.5, reclaimed=False, zone="z2")
    with sessions() as s:
        first = evidence.refresh(s, clock.now())
        _assert_same(first, reclaim_rates(s, cap, now=clock.now()))
    assert first["spot/g.1/z1"].reclaims == pytest.approx(0.5**0.5)
    clock.advance(4 * 3600.0)
    with transaction(sessions) as s:
        add_spot_life(s, clock, hours=2.0, ended_h_ago=1.0, reclaimed=True)
    with sessions() as s:
        _assert_same(evidence.refresh(s, clock.now()), reclaim_rates(s, cap, now=clock.now()))
    clock.advance(5 * 3600.0)  # the first two lives ended 9.5 h ago: past the cutoff
    with sessions() as s:
        later = evidence.refresh(s, clock.now())
        _assert_same(later, reclaim_rates(s, cap, now=clock.now()))
    assert set(later) == {"spot/g.1/z1"}
    assert later["spot/g.1/z1"].reclaims == pytest.approx(0.5**6)
    clock.advance(2000 * 3600.0)  # 2,000 half-lives: 2 ** 2000 would overflow a float
    with transaction(sessions) as s:
        add_spot_life(s, clock, hours=1.0, ended_h_ago=1.0, reclaimed=True, zone="z3")
    with sessions() as s:
        last = evidence.refresh(s, clock.now())
        _assert_same(last, reclaim_rates(s, cap, now=clock.now()))
    assert set(last) == {"spot/g.1/z3"} and last["spot/g.1/z3"].reclaims == pytest.approx(0.5)
