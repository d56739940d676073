"""Spot reclaims observed, per offering (capacity type x instance type x zone).

Nothing new is recorded for this: every spot instance's record already says when it
started billing (`launched_at`), when it ended (`terminated_at`, or now for a live
one) and, in its history, whether a reclaim ended it (an `instance_events` row into
`preempted`). `spot_lives` reads those records as evidence and `reclaim_rates` turns
the evidence into each offering's estimated rate with the estimator of
`autoscaler.planner.reclaim_rate` (prior from config, old evidence decaying). The
policy input, `/metrics`, the dashboard and the planner read the same estimates.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from autoscaler.config import CapacityConfig
from autoscaler.planner.reclaim_rate import ReclaimEstimate, ReclaimPrior, SpotLife, estimate
from autoscaler.state.models import Instance, InstanceEvent

SPOT = "spot"
# Evidence older than this many half-lives weighs under 0.4 %: not read at all.
_HALF_LIVES_READ = 8


def offering_key(capacity_type: str, instance_type: str, zone: str | None) -> str:
    """The same key as `providers.base.Offering.key` and the planner's `OfferingView.key`."""
    return f"{capacity_type}/{instance_type}/{zone or '-'}"


def reclaim_prior(cfg: CapacityConfig) -> ReclaimPrior:
    return ReclaimPrior(cfg.reclaim_prior_per_hour, cfg.reclaim_prior_hours, cfg.reclaim_half_life_h)


def spot_lives(session: Session, *, now: datetime, half_life_h: float) -> dict[str, list[SpotLife]]:
    """Each spot instance's billed life, grouped by offering key, for those that ended
    within `_HALF_LIVES_READ` half-lives of `now` (or still run)."""
    since = now - timedelta(hours=half_life_h * _HALF_LIVES_READ)
    reclaimed = exists().where(InstanceEvent.instance_id == Instance.id, InstanceEvent.to_state == "preempted")
    rows = session.execute(
        select(
            Instance.instance_type,
            Instance.zone,
            Instance.launched_at,
            Instance.terminated_at,
            reclaimed.label("reclaimed"),
        ).where(
            Instance.capacity_type == SPOT,
            Instance.launched_at.is_not(None),
            or_(Instance.terminated_at.is_(None), Instance.terminated_at >= since),
        )
    )
    out: dict[str, list[SpotLife]] = defaultdict(list)
    for itype, zone, start, end, was_reclaimed in rows:
        if start is None:
            continue
        stop = min(end or now, now)
        hours = max((stop - start).total_seconds(), 0.0) / 3600.0
        age = max((now - stop).total_seconds(), 0.0) / 3600.0
        out[offering_key(SPOT, itype, zone)].append(SpotLife(hours, bool(was_reclaimed), age))
    return dict(out)


def reclaim_rates(session: Session, cfg: CapacityConfig, *, now: datetime) -> dict[str, ReclaimEstimate]:
    """The estimated reclaim rate of every spot offering with evidence; one without
    any is at the prior (`reclaim_prior(cfg).rate`)."""
    prior = reclaim_prior(cfg)
    return {
        key: estimate(lives, prior)
        for key, lives in spot_lives(session, now=now, half_life_h=prior.half_life_h).items()
    }
