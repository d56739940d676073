"""The delivery job: send pending alert deliveries, retry failed ones with backoff.

Three steps, so no network call ever happens inside a database transaction:

1. claim (one transaction): due rows (`pending`, `next_attempt_at` passed, not claimed)
   get `claimed_until = now + CLAIM_S` by a compare-and-set update, so two processes
   never send the same row at once and a crashed sender's rows are free again later;
2. send (no transaction): each claimed row to its channel;
3. mark (one transaction): `delivered`, or the error and the next attempt
   (`retry.initial_s` doubled per failure, capped at `retry.max_s`), or `failed` when
   `retry.max_attempts` is spent.

A process that dies between 2 and 3 leaves the row claimed; once the claim expires it is
sent again (at-least-once: a receiver may dedupe on the body's `key` or the
X-Autoscaler-Alert header).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import Clock
from autoscaler.config import AutoscalerConfig, RetryConfig
from autoscaler.notify.channels import AlertMessage, DeliveryError, Sender, send
from autoscaler.state.db import transaction
from autoscaler.state.models import AlertDelivery, AlertEvent

log = logging.getLogger(__name__)
CLAIM_S = 120.0
BATCH = 100
STATUSES = ("pending", "delivered", "failed")


def retry_delay(retry: RetryConfig, attempts: int) -> float:
    """Seconds before attempt `attempts + 1` after `attempts` failures."""
    return float(min(retry.initial_s * 2.0 ** max(attempts - 1, 0), retry.max_s))


def message_of(event: AlertEvent, deployment: str) -> AlertMessage:
    return AlertMessage(
        id=event.id,
        key=event.key,
        kind=event.kind,
        level=event.level,
        message=event.message,
        created_at=event.created_at,
        deployment=deployment,
        team=event.team,
        period=event.period,
        threshold_pct=event.threshold_pct,
        basis=event.basis,
        details=dict(event.details or {}),
    )


@dataclass
class Outcome:
    delivery_id: int
    channel: str
    key: str
    error: str | None


def _claim(s: Session, now: datetime, limit: int, deployment: str) -> list[tuple[int, str, AlertMessage]]:
    rows = s.execute(
        select(AlertDelivery, AlertEvent)
        .join(AlertEvent, AlertEvent.id == AlertDelivery.event_id)
        .where(
            AlertDelivery.status == "pending",
            AlertDelivery.next_attempt_at <= now,
            or_(AlertDelivery.claimed_until.is_(None), AlertDelivery.claimed_until <= now),
        )
        .order_by(AlertDelivery.id)
        .limit(limit)
    ).all()
    out = []
    for d, e in rows:
        taken = s.execute(
            update(AlertDelivery)
            .where(
                AlertDelivery.id == d.id,
                AlertDelivery.status == "pending",
                or_(AlertDelivery.claimed_until.is_(None), AlertDelivery.claimed_until <= now),
            )
            .values(claimed_until=now + timedelta(seconds=CLAIM_S))
            .execution_options(synchronize_session=False)
        )
        if getattr(taken, "rowcount", 0) == 1:
            out.append((d.id, d.channel, message_of(e, deployment)))
    return out


def deliver_pending(
    sessions: sessionmaker[Session],
    config: AutoscalerConfig,
    clock: Clock,
    *,
    sender: Sender = send,
    limit: int = BATCH,
) -> list[Outcome]:
    """One run of the job: claim, send, mark. Returns what was attempted."""
    notifications = config.notifications
    with transaction(sessions) as s:
        claimed = _claim(s, clock.now(), limit, config.deployment)
    outcomes = []
    for delivery_id, channel_name, msg in claimed:
        channel = notifications.channel(channel_name)
        error: str | None = None
        if channel is None:
            error = f"channel {channel_name!r} is no longer configured"
        else:
            try:
                sender(channel, msg)
            except DeliveryError as exc:
                error = str(exc) or type(exc).__name__
            except Exception as exc:  # a sender bug must not stop the other deliveries
                log.exception("sending alert %s on %s failed", msg.key, channel_name)
                error = f"{type(exc).__name__}: {exc}"
        outcomes.append(Outcome(delivery_id, channel_name, msg.key, error))
    if not outcomes:
        return outcomes
    with transaction(sessions) as s:
        now = clock.now()
        for o in outcomes:
            d = s.get(AlertDelivery, o.delivery_id)
            if d is None:
                continue
            d.attempts += 1
            d.claimed_until = None
            if o.error is None:
                d.status, d.delivered_at, d.last_error = "delivered", now, None
                log.info("alert %s delivered on %s", o.key, o.channel)
                continue
            d.last_error = o.error[:2000]
            retry = notifications.retry
            if retry.max_attempts and d.attempts >= retry.max_attempts:
                d.status = "failed"
                log.error("alert %s on %s failed for good after %d attempts: %s", o.key, o.channel, d.attempts, o.error)
            else:
                d.next_attempt_at = now + timedelta(seconds=retry_delay(retry, d.attempts))
                log.warning(
                    "alert %s on %s not delivered (attempt %d, next at %s): %s",
                    o.key,
                    o.channel,
                    d.attempts,
                    d.next_attempt_at,
                    o.error,
                )
    return outcomes


def send_test(config: AutoscalerConfig, channel_name: str, now: datetime, *, sender: Sender = send) -> None:
    """`autoscaler alerts test --channel NAME`: one test message, now; raises DeliveryError."""
    channel = config.notifications.channel(channel_name)
    if channel is None:
        known = [c.name for c in config.notifications.channels]
        raise DeliveryError(f"no channel named {channel_name!r} in notifications.channels (known: {known})")
    msg = AlertMessage(
        id=0,
        key=f"test/{channel_name}/{now:%Y%m%dT%H%M%SZ}",
        kind="test",
        level="info",
        message=f"Test message from the {config.deployment} autoscaler to channel {channel_name}.",
        created_at=now,
        deployment=config.deployment,
        test=True,
    )
    sender(channel, msg)


def delivery_rows(s: Session, *, limit: int = 100, team: str | None = None) -> list[dict[str, Any]]:
    """The newest alerts with each channel's delivery status (for the CLI and dashboard)."""
    stmt = select(AlertEvent).order_by(AlertEvent.id.desc()).limit(limit)
    if team is not None:
        stmt = stmt.where(AlertEvent.team == team)
    events = list(s.scalars(stmt))
    by_event: dict[int, list[AlertDelivery]] = {}
    if events:
        for d in s.scalars(
            select(AlertDelivery).where(AlertDelivery.event_id.in_([e.id for e in events])).order_by(AlertDelivery.id)
        ):
            by_event.setdefault(d.event_id, []).append(d)
    return [
        {
            "id": e.id,
            "key": e.key,
            "kind": e.kind,
            "team": e.team,
            "level": e.level,
            "period": e.period,
            "threshold_pct": e.threshold_pct,
            "basis": e.basis,
            "message": e.message,
            "created_at": e.created_at.isoformat(),
            "deliveries": [
                {
                    "channel": d.channel,
                    "status": d.status,
                    "attempts": d.attempts,
                    "last_error": d.last_error,
                    "next_attempt_at": d.next_attempt_at.isoformat() if d.status == "pending" else None,
                    "delivered_at": d.delivered_at.isoformat() if d.delivered_at else None,
                }
                for d in by_event.get(e.id, [])
            ],
        }
        for e in events
    ]


def delivery_counts(s: Session, team: str | None = None) -> dict[tuple[str, str], int]:
    """(channel, status) -> deliveries (of one team's alerts with `team`), for `/metrics`."""
    stmt = select(AlertDelivery.channel, AlertDelivery.status, func.count()).group_by(
        AlertDelivery.channel, AlertDelivery.status
    )
    if team is not None:
        stmt = stmt.join(AlertEvent, AlertEvent.id == AlertDelivery.event_id).where(AlertEvent.team == team)
    return {(str(c), str(st)): int(n) for c, st, n in s.execute(stmt)}
