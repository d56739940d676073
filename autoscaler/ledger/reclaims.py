"""Spot reclaims observed, per offering (capacity type x instance type x zone).

Nothing new is recorded for this: every spot instance's record already says when it
started billing (`launched_at`), when it ended (`terminated_at`, or now for a live
one) and, in its history, whether a reclaim ended it (an `instance_events` row into
`preempted`). `spot_lives` reads those records as evidence and `reclaim_rates` turns
the evidence into each offering's estimated rate with the estimator of
`autoscaler.planner.reclaim_rate` (prior from config, old evidence decaying). The
policy input, `/metrics`, the dashboard and the planner read the same estimates.

`ReclaimEvidence` is the reconcile loop's running copy: an ended life never changes,
so it is read once and kept as decayed sums, and each refresh reads only the spot
instances still running and those that ended since the last one. Without it the
loop re-read every spot life of the last `_HALF_LIVES_READ` half-lives every few
minutes, which grows with history (a simulated fortnight of checkpointing tasks has
tens of thousands of reclaimed instances).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, or_, select
from sqlalchemy.orm import Session

from autoscaler.config import CapacityConfig
from autoscaler.planner.reclaim_rate import ReclaimEstimate, ReclaimPrior, SpotLife, estimate, posterior
from autoscaler.state.models import Instance, InstanceEvent

SPOT = "spot"
# Evidence older than this many half-lives weighs under 0.4 %: not read at all.
_HALF_LIVES_READ = 8


def offering_key(capacity_type: str, instance_type: str, zone: str | None) -> str:
    """The same key as `providers.base.Offering.key` and the planner's `OfferingView.key`."""
    return f"{capacity_type}/{instance_type}/{zone or '-'}"


def reclaim_prior(cfg: CapacityConfig) -> ReclaimPrior:
    return ReclaimPrior(cfg.reclaim_prior_per_hour, cfg.reclaim_prior_hours, cfg.reclaim_half_life_h)


def _read_since(now: datetime, half_life_h: float) -> datetime:
    return now - timedelta(hours=half_life_h * _HALF_LIVES_READ)


def _spot_rows(session: Session, ended_since: datetime) -> Any:
    """(id, instance type, zone, launched, terminated, reclaimed) of every billed spot
    instance still running or terminated at or after `ended_since`."""
    reclaimed = exists().where(InstanceEvent.instance_id == Instance.id, InstanceEvent.to_state == "preempted")
    return session.execute(
        select(
            Instance.id,
            Instance.instance_type,
            Instance.zone,
            Instance.launched_at,
            Instance.terminated_at,
            reclaimed.label("reclaimed"),
        ).where(
            Instance.capacity_type == SPOT,
            Instance.launched_at.is_not(None),
            or_(Instance.terminated_at.is_(None), Instance.terminated_at >= ended_since),
        )
    )


def spot_lives(session: Session, *, now: datetime, half_life_h: float) -> dict[str, list[SpotLife]]:
    """Each spot instance's billed life, grouped by offering key, for those that ended
    within `_HALF_LIVES_READ` half-lives of `now` (or still run)."""
    out: dict[str, list[SpotLife]] = defaultdict(list)
    for _id, itype, zone, start, end, was_reclaimed in _spot_rows(session, _read_since(now, half_life_h)):
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


# An ended life is looked for again this long after the last refresh: a termination
# written by a transaction that began before that refresh (its `terminated_at` is the
# transaction's clock) still lands in the next one. Ids already counted are skipped.
_LATE_WRITE = timedelta(hours=1)
# Ended lives are weighted 2 ** ((end - origin) / half-life); the origin moves up
# before that exponent nears a float's range.
_REBASE_HALF_LIVES = 512.0


@dataclass(order=True, slots=True)
class _Ended:
    end: datetime
    key: str = field(compare=False)
    hours_w: float = field(compare=False)  # hours x its weight
    reclaim_w: float = field(compare=False)  # its weight if a reclaim ended it, else 0


@dataclass
class ReclaimEvidence:
    """`reclaim_rates`, kept current by reading only what changed since the last refresh.

    Ended lives are folded into per-offering sums, each weighted by `2 ** ((end -
    origin) / half_life)`; at `now` those sums times `0.5 ** ((now - origin) /
    half_life)` are the decayed hours and reclaims `estimate` adds up (up to float
    rounding). A life leaves the sums once it ended more than `_HALF_LIVES_READ`
    half-lives ago, when `spot_lives` stops reading it. Live instances are read on
    every refresh (their hours grow); that read is as large as the spot fleet, not
    its history. tests/ledger/test_reclaims.py checks it against `reclaim_rates`.
    """

    prior: ReclaimPrior
    _origin: datetime | None = None
    _last: datetime | None = None
    _hours: dict[str, float] = field(default_factory=dict)
    _reclaims: dict[str, float] = field(default_factory=dict)
    _lives: dict[str, int] = field(default_factory=dict)  # ended lives in the sums, per key
    _ended: list[_Ended] = field(default_factory=list)  # a heap by end time
    _counted: dict[str, datetime] = field(default_factory=dict)  # id -> end, recent ones

    def refresh(self, session: Session, now: datetime) -> dict[str, ReclaimEstimate]:
        since = _read_since(now, self.prior.half_life_h)
        hl = self.prior.half_life_h
        if self._origin is None:
            self._origin = now
        elif hl > 0 and (now - self._origin).total_seconds() / 3600.0 > _REBASE_HALF_LIVES * hl:
            self._rebase(now)
        ended_since = since if self._last is None else max(since, self._last - _LATE_WRITE)
        live: dict[str, float] = defaultdict(float)
        live_reclaims: dict[str, float] = defaultdict(float)  # reclaimed, not yet terminated
        for iid, itype, zone, start, end, was_reclaimed in _spot_rows(session, ended_since):
            key = offering_key(SPOT, itype, zone)
            if end is None or end > now:
                live[key] += max((min(end or now, now) - start).total_seconds(), 0.0) / 3600.0
                live_reclaims[key] += 1.0 if was_reclaimed else 0.0
            elif iid not in self._counted:
                self._fold(iid, key, start, end, bool(was_reclaimed))
        self._forget(since)
        self._last = now
        self._counted = {i: e for i, e in self._counted.items() if e >= now - _LATE_WRITE}
        decay = 1.0 / self._weight(now)
        return {
            key: posterior(
                self._hours.get(key, 0.0) * decay + live.get(key, 0.0),
                self._reclaims.get(key, 0.0) * decay + live_reclaims.get(key, 0.0),
                self.prior,
            )
            for key in sorted(set(self._lives) | set(live))
        }

    def _weight(self, at: datetime) -> float:
        """2 ** ((at - origin) / half_life), the weight of a life that ended at `at`."""
        assert self._origin is not None
        hl = self.prior.half_life_h
        return float(2.0 ** ((at - self._origin).total_seconds() / 3600.0 / hl)) if hl > 0 else 1.0

    def _fold(self, iid: str, key: str, start: datetime, end: datetime, reclaimed: bool) -> None:
        w = self._weight(end)
        life = _Ended(end, key, max((end - start).total_seconds(), 0.0) / 3600.0 * w, w if reclaimed else 0.0)
        self._hours[key] = self._hours.get(key, 0.0) + life.hours_w
        self._reclaims[key] = self._reclaims.get(key, 0.0) + life.reclaim_w
        self._lives[key] = self._lives.get(key, 0) + 1
        heapq.heappush(self._ended, life)
        self._counted[iid] = end

    def _rebase(self, origin: datetime) -> None:
        assert self._origin is not None
        # 2 ** -x: tiny or 0.0 for old sums, never an overflow
        scale = 0.5 ** ((origin - self._origin).total_seconds() / 3600.0 / self.prior.half_life_h)
        self._origin = origin
        for key in self._hours:
            self._hours[key] *= scale
            self._reclaims[key] *= scale
        for life in self._ended:
            life.hours_w *= scale
            life.reclaim_w *= scale

    def _forget(self, since: datetime) -> None:
        """Take out of the sums the lives that ended before `since`."""
        while self._ended and self._ended[0].end < since:
            old = heapq.heappop(self._ended)
            self._lives[old.key] -= 1
            if self._lives[old.key] == 0:  # exactly nothing left, not a rounding residue
                del self._lives[old.key], self._hours[old.key], self._reclaims[old.key]
            else:
                self._hours[old.key] -= old.hours_w
                self._reclaims[old.key] -= old.reclaim_w
