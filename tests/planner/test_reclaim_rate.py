"""The reclaim-rate estimator (autoscaler.planner.reclaim_rate): the prior, the
decay of old evidence, and convergence on a simulated world with known rates."""

from __future__ import annotations

import random

import pytest

from autoscaler.planner.reclaim_rate import ReclaimPrior, SpotLife, estimate

PRIOR = ReclaimPrior(rate=0.24, hours=20.0, half_life_h=14 * 24.0)


def _world(rate: float, hours_wanted: float, seed: int, *, max_age_h: float = 7 * 24.0) -> list[SpotLife]:
    """Spot instances in a zone whose reclaims are Poisson at `rate`: each is meant to
    run 0.5-8 h and is reclaimed if an exponential draw of that rate comes first; they
    ended at random times over the last `max_age_h` hours."""
    rng = random.Random(f"{seed}/{rate}")
    lives: list[SpotLife] = []
    total = 0.0
    while total < hours_wanted:
        planned = rng.uniform(0.5, 8.0)
        until_reclaim = rng.expovariate(rate)
        hours = min(planned, until_reclaim)
        lives.append(SpotLife(hours, until_reclaim < planned, rng.uniform(0.0, max_age_h)))
        total += hours
    return lives


def test_without_evidence_the_estimate_is_the_prior() -> None:
    e = estimate([], PRIOR)
    assert e.rate == pytest.approx(0.24)
    assert e.hours == 0.0 and e.reclaims == 0.0
    # sqrt(0.24 x 20) / 20
    assert e.sd == pytest.approx((0.24 * 20) ** 0.5 / 20)


def test_the_posterior_mean_by_hand() -> None:
    # 3 reclaims in 10 fresh hours with 20 prior hours at 0.24: (4.8 + 3) / (20 + 10).
    lives = [SpotLife(2.0, True), SpotLife(3.0, True), SpotLife(4.0, True), SpotLife(1.0, False)]
    assert estimate(lives, PRIOR).rate == pytest.approx(7.8 / 30)


def test_evidence_one_half_life_old_counts_half() -> None:
    old = [SpotLife(10.0, True, age_h=PRIOR.half_life_h)]
    e = estimate(old, PRIOR)
    assert e.hours == pytest.approx(5.0) and e.reclaims == pytest.approx(0.5)
    assert e.rate == pytest.approx((4.8 + 0.5) / 25)


@pytest.mark.parametrize("seed", range(10))
def test_it_converges_within_20_percent_on_a_world_with_known_per_zone_rates(seed: int) -> None:
    # The documented amount of evidence: ~250 reclaims per offering, i.e. 250 / rate
    # instance-hours (5,000 h at 0.05/h, 1,040 h at 0.24, 420 h at 0.6), over a week.
    # Ten seeds of three zones: the worst error measured was 17 %.
    for rate in (0.05, 0.24, 0.6):
        e = estimate(_world(rate, 250 / rate, seed), PRIOR)
        assert abs(e.rate - rate) / rate < 0.20, (seed, rate, e)
        # The uncertainty it reports is of the size of its error: about 1/sqrt(250).
        assert 0.04 < e.sd / e.rate < 0.10


def test_with_little_evidence_the_prior_still_weighs() -> None:
    # 10 calm hours cannot talk the estimate down from 0.24 to 0.
    e = estimate([SpotLife(10.0, False)], PRIOR)
    assert e.rate == pytest.approx(4.8 / 30)
    assert e.rate > 0.1


def test_a_zone_that_got_worse_shows_it_within_a_few_half_lives() -> None:
    # A calm month long ago (0.05/h), then three days at 0.6/h.
    old = [SpotLife(x.hours, x.reclaimed, x.age_h + 60 * 24) for x in _world(0.05, 2000, 1, max_age_h=30 * 24)]
    new = _world(0.6, 170, 2, max_age_h=3 * 24)
    decayed = estimate(old + new, PRIOR)
    kept = estimate(old + new, ReclaimPrior(0.24, 20.0, half_life_h=1e12))
    assert decayed.rate > 0.3  # nearer the new rate than the old one
    assert kept.rate < 0.15  # what forgetting nothing would say
