"""The instance state machine as a table, and the one function allowed to move an instance.

Every change appends an `InstanceEvent` with the reason, so the life of every machine
we paid for can be read back ("why was i-0abc terminated at 03:12?").
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy.orm import Session

from autoscaler.errors import Conflict
from autoscaler.state.lifecycle import note
from autoscaler.state.models import Instance, InstanceEvent


class InstanceState(StrEnum):
    REQUESTED = "requested"
    LAUNCHING = "launching"
    BOOTING = "booting"
    READY = "ready"
    DRAINING = "draining"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    LAUNCH_FAILED = "launch_failed"
    BOOT_TIMEOUT = "boot_timeout"
    LOST = "lost"
    PREEMPTED = "preempted"


S = InstanceState
TRANSITIONS: dict[InstanceState, dict[InstanceState, str]] = {
    S.REQUESTED: {
        S.LAUNCHING: "intent committed; the provider is being called with the request id",
        S.BOOTING: "a crash left the intent behind, and the provider's listing shows the instance: adopted",
        S.LAUNCH_FAILED: "the provider refused (capacity, quota, bad request)",
        S.TERMINATED: "the intent was abandoned before any instance existed",
        S.TERMINATING: "given up (boot timeout, budget) before the launch went through",
        S.BOOT_TIMEOUT: "never launched nor adopted within the boot timeout",
    },
    S.LAUNCHING: {
        S.BOOTING: "the provider returned an instance id",
        S.LAUNCH_FAILED: "the provider refused",
        S.BOOT_TIMEOUT: "the call never came back with an instance within the boot timeout",
        S.TERMINATING: "given up before the instance was recorded",
    },
    S.BOOTING: {
        S.READY: "the agent registered",
        S.BOOT_TIMEOUT: "no agent registered within the pool's boot timeout",
        S.LOST: "the provider no longer lists it",
        S.PREEMPTED: "spot capacity reclaimed before the agent registered",
        S.TERMINATING: "not needed any more (team over budget)",
    },
    S.READY: {
        S.DRAINING: "idle past the timeout, team over budget, or a spot notice",
        S.LOST: "the worker stopped heartbeating or the provider no longer lists it",
        S.PREEMPTED: "spot capacity reclaimed",
        S.TERMINATING: "terminated without a drain (worker already gone)",
    },
    S.DRAINING: {
        S.TERMINATING: "the worker finished its tasks and left",
        S.LOST: "vanished while draining",
        S.PREEMPTED: "reclaimed while draining",
        S.READY: "the drain was refused: the worker leased a task meanwhile",
    },
    S.TERMINATING: {
        S.TERMINATED: "the provider confirmed, or no longer lists it",
    },
    S.LAUNCH_FAILED: {
        S.TERMINATED: "nothing to clean up (terminal)",
    },
    S.BOOT_TIMEOUT: {S.TERMINATING: "terminated after the boot timeout"},
    S.LOST: {S.TERMINATING: "terminated to be sure it is gone (idempotent)"},
    S.PREEMPTED: {S.TERMINATING: "terminated to acknowledge the reclaim"},
    S.TERMINATED: {},
}

LIVE = frozenset({S.REQUESTED, S.LAUNCHING, S.BOOTING, S.READY, S.DRAINING})
# States in which the provider may bill us (spend accrues).
BILLED = frozenset({S.LAUNCHING, S.BOOTING, S.READY, S.DRAINING, S.TERMINATING, S.BOOT_TIMEOUT, S.LOST})
FINAL = frozenset({S.TERMINATED, S.LAUNCH_FAILED})


def transition(session: Session, inst: Instance, to: InstanceState, *, reason: str, now: datetime) -> None:
    """Move `inst` to `to` and append the history row, or raise Conflict."""
    current = InstanceState(inst.state)
    if current == to:
        return
    if to not in TRANSITIONS[current]:
        raise Conflict(f"instance {inst.id} is {current.value}; it cannot become {to.value}")
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
    if to in (S.TERMINATED, S.LAUNCH_FAILED) and inst.terminated_at is None:
        inst.terminated_at = now
