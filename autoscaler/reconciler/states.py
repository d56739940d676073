"""The one function allowed to move an instance, checked against the table in
`autoscaler.lifecycle`.

Every change appends an `InstanceEvent` with the reason, so the life of every machine
we paid for can be read back ("why was i-0abc terminated at 03:12?").
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from autoscaler.errors import Conflict
from autoscaler.lifecycle import (
    INSTANCE_BILLED,
    INSTANCE_FINAL,
    INSTANCE_LIVE,
    INSTANCE_TRANSITIONS,
    IllegalTransition,
    InstanceState,
    check_transition,
)
from autoscaler.state.lifecycle_log import note
from autoscaler.state.models import Instance, InstanceEvent

__all__ = ["BILLED", "FINAL", "LIVE", "TRANSITIONS", "InstanceState", "transition"]


S = InstanceState
# Re-exported under their old names: the callers' vocabulary ("LIVE", "BILLED", "FINAL").
TRANSITIONS = INSTANCE_TRANSITIONS
LIVE = INSTANCE_LIVE
BILLED = INSTANCE_BILLED
FINAL = INSTANCE_FINAL


def transition(session: Session, inst: Instance, to: InstanceState, *, reason: str, now: datetime) -> None:
    """Move `inst` to `to` and append the history row, or raise Conflict."""
    current = InstanceState(inst.state)
    if current == to:
        return
    try:
        check_transition(INSTANCE_TRANSITIONS, "instance", inst.id, current, to)
    except IllegalTransition as e:
        raise Conflict(str(e)) from None
    session.add(
        InstanceEvent(instance_id=inst.id, at=now, from_state=current.value, to_state=to.value, reason=reason[:255])
    )
    note(
        session,
        "instance %s (pool %s%s): %s -> %s: %s",
        inst.id,
        inst.pool,
        f", {inst.provider_instance_id}" if inst.provider_instance_id else "",
        current.value,
        to.value,
        reason,
        instance_id=inst.id,
        pool=inst.pool,
        team=inst.team,
    )
    inst.state = to.value
    inst.updated_at = now
    if to == S.READY and inst.ready_at is None:
        inst.ready_at = now
    if to in INSTANCE_FINAL and inst.terminated_at is None:
        inst.terminated_at = now
