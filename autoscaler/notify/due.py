"""Which alerts a reconcile cycle makes due, recorded in the cycle's own record
transaction (no network here): one `AlertEvent` per alert identity and one pending
`AlertDelivery` per channel its routes name.

An alert's identity (`AlertEvent.key`) is what makes it "the same alert":

- budget threshold: team, budget period (YYYY-MM), basis (actual/forecast), threshold;
- hard budget froze or drained a team: team, period;
- a machine that never registered: the instance;
- a condition that lasts (a pool in launch backoff, the policy failing safe): the
  condition and the instant it began, kept in `alert_conditions`, so it alerts once per
  episode, after `pool_backoff_minutes` / `fail_safe_minutes`.

A second cycle, a restarted process or a new leader seeing the same alert finds the key
and adds nothing, so each is delivered once per channel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autoscaler.config import NotificationsConfig
from autoscaler.ledger.period import month_of
from autoscaler.policy.schema import EvaluationResult
from autoscaler.reconciler.errors import BACKOFF_MAX_S
from autoscaler.state.models import AlertCondition, AlertDelivery, AlertEvent

if TYPE_CHECKING:
    from autoscaler.reconciler.cycle import CycleResult
    from autoscaler.reconciler.snapshot import Snapshot

FLEET = "-"  # the route filter that matches alerts of no team
CONDITION_PREFIXES = ("pool_backoff/", "fail_safe")
# A condition not seen for this long is over (the longest launch backoff).
GRACE = timedelta(seconds=BACKOFF_MAX_S)


@dataclass(frozen=True)
class Due:
    key: str
    kind: str
    level: str
    message: str
    team: str | None = None
    period: str | None = None
    threshold_pct: float | None = None
    basis: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


def channels_for(config: NotificationsConfig, *, kind: str, team: str | None, level: str) -> list[str]:
    """Channel names an alert goes to: every route it matches (all channels without routes)."""
    if not config.routes:
        return [c.name for c in config.channels]
    out: list[str] = []
    for route in config.routes:
        if route.teams and (team or FLEET) not in route.teams:
            continue
        if route.levels and level not in route.levels:
            continue
        if route.kinds and kind not in route.kinds:
            continue
        out.extend(c for c in route.channels if c not in out)
    return out


def budget_dues(evaluation: EvaluationResult, now: datetime) -> list[Due]:
    period = month_of(now)
    decision = evaluation.decision
    out = []
    for a in decision.alerts:
        who = a.team or FLEET
        out.append(
            Due(
                key=f"budget/{who}/{period}/{a.basis}/{a.threshold_pct:g}",
                kind="budget",
                level=a.level,
                message=a.message,
                team=a.team,
                period=period,
                threshold_pct=a.threshold_pct,
                basis=a.basis,
            )
        )
    if decision.fail_safe:
        return out  # a failed policy freezes everyone: that is the fail-safe alert, not a budget's
    for team, td in sorted(decision.teams.items()):
        budget_reasons = [r for r in td.reasons if r.startswith("budget")]
        if td.drain and budget_reasons:
            out.append(
                Due(
                    key=f"budget_drain/{team}/{period}",
                    kind="budget_drain",
                    level="critical",
                    message=f"team {team} is being drained by its hard budget: " + "; ".join(budget_reasons),
                    team=team,
                    period=period,
                )
            )
        if not td.may_scale_up and any("frozen" in r for r in budget_reasons):
            out.append(
                Due(
                    key=f"budget_freeze/{team}/{period}",
                    kind="budget_freeze",
                    level="warning",
                    message=f"team {team} may not scale up (hard budget): " + "; ".join(budget_reasons),
                    team=team,
                    period=period,
                )
            )
    return out


def never_registered_dues(result: CycleResult) -> list[Due]:
    return [
        Due(
            key=f"never_registered/{t.instance_id}",
            kind="never_registered",
            level="warning",
            message=f"instance {t.instance_id} in pool {t.pool} never registered: {t.reason}; terminated",
            details={"instance": t.instance_id, "pool": t.pool},
        )
        for t in result.plan.terminations
        if t.mark == "boot_timeout"
    ]


def _conditions(snap: Snapshot, evaluation: EvaluationResult, now: datetime) -> dict[str, str]:
    """Ongoing conditions this cycle: key -> what it is."""
    active: dict[str, str] = {}
    for p in snap.pools:
        # Backing off, or its offerings still blocked after the errors (the planner then
        # does not even try it): either way its demand cannot launch there.
        if p.backoff_until is not None and (p.backoff_until > now or p.blocked):
            active[f"pool_backoff/{p.name}"] = p.name
    if evaluation.decision.fail_safe or evaluation.error:
        active["fail_safe"] = evaluation.error or evaluation.decision.error or "policy failed"
    return active


def condition_dues(
    s: Session, snap: Snapshot, evaluation: EvaluationResult, now: datetime, config: NotificationsConfig
) -> list[Due]:
    """A condition is one episode while it is seen at least every GRACE (a pool's
    backoff lapses between retries; that is not a new episode)."""
    active = _conditions(snap, evaluation, now)
    rows = {c.key: c for c in s.scalars(select(AlertCondition))}
    gone = [
        k for k, c in rows.items() if k not in active and k.startswith(CONDITION_PREFIXES) and now - c.last_seen > GRACE
    ]
    if gone:
        s.execute(delete(AlertCondition).where(AlertCondition.key.in_(gone)))
    out = []
    for key, what in sorted(active.items()):
        row = rows.get(key)
        if row is None:
            row = AlertCondition(key=key, since=now, last_seen=now)
            s.add(row)
        elif now - row.last_seen > GRACE:
            row.since = row.last_seen = now  # over for longer than the grace: a new episode
        else:
            row.last_seen = now
        lasted = now - row.since
        episode = f"{key}/{row.since:%Y%m%dT%H%M%SZ}"
        if key.startswith("pool_backoff/"):
            if lasted >= timedelta(minutes=config.pool_backoff_minutes):
                minutes = lasted.total_seconds() / 60
                out.append(
                    Due(
                        key=episode,
                        kind="pool_backoff",
                        level="warning",
                        message=f"pool {what} has been in launch backoff for {minutes:.0f} min "
                        "(capacity, quota or launch errors); its demand is waiting or falling back",
                        details={"pool": what, "since": row.since.isoformat()},
                    )
                )
        elif lasted >= timedelta(minutes=config.fail_safe_minutes):
            out.append(
                Due(
                    key=episode,
                    kind="fail_safe",
                    level="critical",
                    message=f"policy fail-safe in force since {row.since:%Y-%m-%d %H:%M} UTC: {what}; "
                    "no team may scale up until it is fixed",
                    details={"since": row.since.isoformat(), "error": what},
                )
            )
    return out


def record(s: Session, dues: Iterable[Due], *, now: datetime, config: NotificationsConfig) -> list[int]:
    """Insert the events not seen before and their pending deliveries; ids of the new events."""
    dues = list(dues)
    if not dues:
        return []
    keys = [d.key for d in dues]
    seen = set(s.scalars(select(AlertEvent.key).where(AlertEvent.key.in_(keys))))
    new_ids = []
    for d in dues:
        if d.key in seen:
            continue
        seen.add(d.key)
        event = AlertEvent(
            key=d.key,
            kind=d.kind,
            team=d.team,
            level=d.level,
            period=d.period,
            threshold_pct=d.threshold_pct,
            basis=d.basis,
            message=d.message,
            details=d.details,
            created_at=now,
        )
        try:
            # A savepoint: a racing writer of the same key must not undo the cycle's record.
            with s.begin_nested():
                s.add(event)
                s.flush()
        except IntegrityError:
            continue
        for channel in channels_for(config, kind=d.kind, team=d.team, level=d.level):
            s.add(
                AlertDelivery(
                    event_id=event.id,
                    channel=channel,
                    status="pending",
                    attempts=0,
                    next_attempt_at=now,
                    created_at=now,
                )
            )
        new_ids.append(event.id)
    s.flush()
    return new_ids


def record_due(
    s: Session,
    *,
    now: datetime,
    snap: Snapshot,
    evaluation: EvaluationResult,
    result: CycleResult,
    config: NotificationsConfig,
) -> list[int]:
    """Everything this cycle makes due; called inside the cycle's record transaction."""
    dues = [
        *budget_dues(evaluation, now),
        *never_registered_dues(result),
        *condition_dues(s, snap, evaluation, now, config),
    ]
    return record(s, dues, now=now, config=config)
