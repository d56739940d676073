"""Security events: refused registrations, token replays, authorization failures.

Each event is a row in `security_events` (what `/metrics` counts and the dashboard's
admin page lists), one WARNING log line and an in-process counter. None of them ever
holds a token: an event names the token row's id (the `id` token creation returns) and
kind when the token was recognised, else nothing.

Refusals are raised as domain errors carrying a `SecurityNote`; the API records the
note after the request's transaction has rolled back (`record_note`), in a
transaction of its own, so the refusal's own writes never survive but its record does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from prometheus_client import Counter
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.errors import SecurityNote
from autoscaler.metrics.instruments import PROCESS_REGISTRY
from autoscaler.state.db import transaction
from autoscaler.state.models import SecurityEvent

log = logging.getLogger("autoscaler.security")

REGISTRATION_REFUSED = "registration_refused"  # claimed identity does not match the token's launch
JOIN_REPLAY = "join_replay"  # a consumed join token presented again
WORKER_TOKEN_REPLAY = "worker_token_replay"  # a worker token presented after it re-registered
AUTH_FAILED = "auth_failed"  # unknown, expired or revoked token (401)
FORBIDDEN = "forbidden"  # a valid token used beyond its rights (wrong kind, another worker)
# A launch's token registered an instance id the provider later reported otherwise.
LAUNCH_MISMATCH = "launch_mismatch"
KINDS = (REGISTRATION_REFUSED, JOIN_REPLAY, WORKER_TOKEN_REPLAY, AUTH_FAILED, FORBIDDEN, LAUNCH_MISMATCH)

SECURITY_EVENTS = Counter(
    "autoscaler_security_events_recorded",
    "Security events recorded by this process, by kind (the database-wide count is autoscaler_security_events).",
    ["kind"],
    registry=PROCESS_REGISTRY,
)


def record(session: Session, note: SecurityNote, *, now: datetime, client: str = "") -> SecurityEvent:
    """Add the event to `session` (the caller commits), log it and count it."""
    event = SecurityEvent(
        at=now,
        kind=note.kind[:32],
        client=client[:64],
        token_id=note.token_id,
        token_kind=note.token_kind,
        pool=(note.pool or None) and note.pool[:64],
        instance_id=(note.instance_id or None) and note.instance_id[:128],
        worker_id=note.worker_id,
        detail=note.detail[:1000],
    )
    session.add(event)
    SECURITY_EVENTS.labels(kind=event.kind).inc()
    log.warning(
        "security event %s: %s (client %s, token id %s, pool %s, instance %s)",
        event.kind,
        event.detail,
        client or "-",
        note.token_id or "-",
        note.pool or "-",
        note.instance_id or "-",
    )
    return event


def record_note(sessions: sessionmaker[Session], note: SecurityNote, *, now: datetime, client: str = "") -> None:
    """Record in a transaction of its own. A database failure here is logged, never
    raised: the refusal itself must still reach the client."""
    try:
        with transaction(sessions) as s:
            record(s, note, now=now, client=client)
    except Exception:
        log.exception("could not record security event %s", note.kind)


def counts(session: Session) -> list[tuple[str, str, int]]:
    """(kind, token kind or "", count) over every recorded event."""
    rows = session.execute(
        select(SecurityEvent.kind, SecurityEvent.token_kind, func.count()).group_by(
            SecurityEvent.kind, SecurityEvent.token_kind
        )
    )
    return [(str(k), str(tk or ""), int(n)) for k, tk, n in rows]


def failures_by_token(session: Session, limit: int = 200) -> list[tuple[str, str, int]]:
    """(token id, token kind, count) of events that named a recognised token, most first."""
    n = func.count().label("n")
    rows = session.execute(
        select(SecurityEvent.token_id, SecurityEvent.token_kind, n)
        .where(SecurityEvent.token_id.is_not(None))
        .group_by(SecurityEvent.token_id, SecurityEvent.token_kind)
        .order_by(n.desc())
        .limit(limit)
    )
    return [(str(t), str(tk or ""), int(c)) for t, tk, c in rows]


def recent(session: Session, limit: int = 100) -> Sequence[SecurityEvent]:
    return list(session.scalars(select(SecurityEvent).order_by(SecurityEvent.id.desc()).limit(limit)))
