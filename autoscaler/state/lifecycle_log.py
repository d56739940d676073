"""One concise INFO line per lifecycle event (launch, lease, drain, termination, ...)
in the server's own log, on the `autoscaler.lifecycle` logger.

A line is written only once the transaction that made the change has committed: a
change rolled back (a conflict, a crash point, a lost race) never appears in the log
as if it had happened. The state machines call `note` where they append their history
rows; the line carries the same ids as the structured JSON logs (`task_id`,
`instance_id`, `worker_id`, `team`, `pool`).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

log = logging.getLogger("autoscaler.lifecycle")
_PENDING = "autoscaler.lifecycle.pending"


def note(session: Session, message: str, *args: object, **ids: Any) -> None:
    """Queue a line for when `session` commits (printf-style `message` and `args`)."""
    if not log.isEnabledFor(logging.INFO):
        return  # the simulator and tests without logging pay nothing
    session.info.setdefault(_PENDING, []).append((message, args, {k: v for k, v in ids.items() if v is not None}))


@event.listens_for(Session, "after_commit")
def _write(session: Session) -> None:
    for message, args, ids in session.info.pop(_PENDING, ()):
        log.info(message, *args, extra=ids)


@event.listens_for(Session, "after_rollback")
def _forget(session: Session) -> None:
    session.info.pop(_PENDING, None)
