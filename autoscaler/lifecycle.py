"""The life of a task, an instance and a worker: their states, the sets derived from
them, and the table of legal transitions for each, with the reason for every edge.

This module is the one definition of those states; everything else imports them from
here. It imports nothing of ours (an import-linter contract), so the planner, the
simulator and the agent-facing code can all read it without pulling in a database.
The writers that move a row (`queueing.states.transition`, `queueing.states.move_worker`,
`reconciler.states.transition`) check every change against these tables.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar


class TaskState(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    INTERRUPTED = "interrupted"
    LOST = "lost"


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


class WorkerState(StrEnum):
    """An agent process tied to an instance id. It registers `idle` (there is no
    separate `registered` state: a worker can lease from its first poll)."""

    IDLE = "idle"
    BUSY = "busy"
    DRAINING = "draining"
    GONE = "gone"


class RankState(StrEnum):
    """One rank of a multi-node task (a gang, `nodes > 1`), on one worker. The task's
    own state is the gang's; a rank's says where that one machine stands."""

    RESERVED = "reserved"  # GPUs held on a worker until every rank has one
    LEASED = "leased"  # the gang is complete: its worker was handed the start
    RUNNING = "running"  # the agent started the process
    STOPPING = "stopping"  # the gang ended elsewhere: its worker is told to stop it
    EXITED = "exited"  # the agent reported the end (exit code on the row)
    RELEASED = "released"  # given up without an end report (reservation timeout, worker gone)


State = TypeVar("State", TaskState, InstanceState, WorkerState, RankState)


class IllegalTransition(ValueError):
    """A writer asked for an edge its table does not have (a bug, or a race the caller
    maps to a conflict)."""

    def __init__(self, kind: str, ident: str, current: StrEnum, to: StrEnum) -> None:
        super().__init__(f"{kind} {ident} is {current.value}; it cannot become {to.value}")
        self.kind, self.ident, self.current, self.to = kind, ident, current, to


_Q, _L, _R = TaskState.QUEUED, TaskState.LEASED, TaskState.RUNNING
_S, _F, _C = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED
_INT, _X = TaskState.INTERRUPTED, TaskState.LOST

TASK_TRANSITIONS: dict[TaskState, dict[TaskState, str]] = {
    _Q: {
        _L: "a worker with enough free GPUs leased it",
        _C: "canceled before it ran",
        _F: "could not be scheduled (e.g. its queue was removed)",
    },
    _L: {
        _R: "the agent started the process",
        _S: "finished before the start report arrived",
        _Q: "exited non-zero before the start report arrived, with failed attempts left: retried",
        _F: "failed to start, or exited non-zero and may not be retried",
        _C: "canceled while leased",
        _INT: "worker drained or preempted before start",
        _X: "worker stopped heartbeating or lease expired",
    },
    _R: {
        _S: "exited 0",
        _Q: "exited non-zero or timed out, with failed attempts left: retried behind waiting work",
        _F: "exited non-zero or timed out, and may not be retried (max_attempts, retry_on_exit_codes)",
        _C: "canceled: the agent stopped it",
        _INT: "spot notice or drain deadline: SIGTERM to checkpoint, then requeue",
        _X: "worker stopped heartbeating",
    },
    _INT: {_Q: "requeued at the head of its queue", _F: "interrupted more than 1000 times", _C: "cancel was requested"},
    _X: {_Q: "requeued at the head of its queue", _F: "interrupted more than 1000 times", _C: "cancel was requested"},
    _S: {},
    _F: {},
    _C: {},
}

# A task that holds GPUs on a worker (the ledger charges its team for them).
TASK_ACTIVE = frozenset({_L, _R})
# A task that will never change again.
TASK_FINAL = frozenset({_S, _F, _C})
# Entering one of these ends an attempt for good or for a requeue by the machine (a
# failed attempt that is retried goes `running -> queued` and is not among them).
TASK_ATTEMPT_ENDED = TASK_FINAL | {_INT, _X}

_I = InstanceState
INSTANCE_TRANSITIONS: dict[InstanceState, dict[InstanceState, str]] = {
    _I.REQUESTED: {
        _I.LAUNCHING: "intent committed; the provider is being called with the request id",
        _I.BOOTING: "a crash left the intent behind, and the provider's listing shows the instance: adopted",
        _I.LAUNCH_FAILED: "the provider refused (capacity, quota, bad request)",
        _I.TERMINATED: "the intent was abandoned before any instance existed",
        _I.TERMINATING: "given up (boot timeout, budget) before the launch went through",
        _I.BOOT_TIMEOUT: "never launched nor adopted within the boot timeout",
    },
    _I.LAUNCHING: {
        _I.BOOTING: "the provider returned an instance id",
        _I.LAUNCH_FAILED: "the provider refused",
        _I.BOOT_TIMEOUT: "the call never came back with an instance within the boot timeout",
        _I.TERMINATING: "given up before the instance was recorded",
    },
    _I.BOOTING: {
        _I.READY: "the agent registered",
        _I.BOOT_TIMEOUT: "no agent registered within the pool's boot timeout",
        _I.LOST: "the provider no longer lists it",
        _I.PREEMPTED: "spot capacity reclaimed before the agent registered",
        _I.TERMINATING: "not needed any more (team over budget)",
    },
    _I.READY: {
        _I.DRAINING: "idle past the timeout, team over budget, or a spot notice",
        _I.LOST: "the worker stopped heartbeating or the provider no longer lists it",
        _I.PREEMPTED: "spot capacity reclaimed",
        _I.TERMINATING: "terminated without a drain (worker already gone)",
    },
    _I.DRAINING: {
        _I.TERMINATING: "the worker finished its tasks and left",
        _I.LOST: "vanished while draining",
        _I.PREEMPTED: "reclaimed while draining",
        _I.READY: "the drain was refused: the worker leased a task meanwhile",
    },
    _I.TERMINATING: {
        _I.TERMINATED: "the provider confirmed, or no longer lists it",
    },
    _I.LAUNCH_FAILED: {
        _I.TERMINATED: "nothing to clean up (terminal)",
    },
    _I.BOOT_TIMEOUT: {_I.TERMINATING: "terminated after the boot timeout"},
    _I.LOST: {_I.TERMINATING: "terminated to be sure it is gone (idempotent)"},
    _I.PREEMPTED: {_I.TERMINATING: "terminated to acknowledge the reclaim"},
    _I.TERMINATED: {},
}

# Holds (or will hold) capacity and counts against a pool's max.
INSTANCE_LIVE = frozenset({_I.REQUESTED, _I.LAUNCHING, _I.BOOTING, _I.READY, _I.DRAINING})
# Capacity asked for whose agent has not registered yet.
INSTANCE_BOOTING = frozenset({_I.REQUESTED, _I.LAUNCHING, _I.BOOTING})
# A machine exists at the provider and may run (or soon run) an agent.
INSTANCE_RUNNING = frozenset({_I.BOOTING, _I.READY, _I.DRAINING})
# Shown as part of the fleet: live, or being terminated right now.
INSTANCE_LISTED = INSTANCE_LIVE | {_I.TERMINATING}
# The passive sync marked it; the planner always terminates it.
INSTANCE_DEAD = frozenset({_I.LOST, _I.PREEMPTED, _I.BOOT_TIMEOUT})
# The provider may bill us for it (spend accrues).
INSTANCE_BILLED = frozenset({_I.LAUNCHING, _I.BOOTING, _I.READY, _I.DRAINING, _I.TERMINATING, _I.BOOT_TIMEOUT, _I.LOST})
# Nothing left at the provider, nothing left to do.
INSTANCE_FINAL = frozenset({_I.TERMINATED, _I.LAUNCH_FAILED})
# The reconciler still has business with it (everything but the final states).
INSTANCE_OPEN = frozenset(InstanceState) - INSTANCE_FINAL
# Its machine cannot be the one an agent registers from now.
INSTANCE_ENDED = INSTANCE_DEAD | INSTANCE_FINAL | {_I.TERMINATING}

_W = WorkerState
WORKER_TRANSITIONS: dict[WorkerState, dict[WorkerState, str]] = {
    _W.IDLE: {
        _W.BUSY: "it leased a task",
        _W.DRAINING: "drained: idle past the pool's timeout, by an admin, by the agent on SIGTERM, or a spot notice",
        _W.GONE: "deregistered, silent past the heartbeat timeout, or replaced by a re-registration",
    },
    _W.BUSY: {
        _W.IDLE: "its last task ended",
        _W.DRAINING: "drained by an admin, by the agent on SIGTERM, a spot notice or a rebalance recommendation",
        _W.GONE: "deregistered, silent past the heartbeat timeout, or replaced by a re-registration",
    },
    _W.DRAINING: {
        # A drain is never undone: a draining worker leases nothing and leaves.
        _W.GONE: "finished its tasks and deregistered, or fell silent as its machine was taken",
    },
    # Terminal: a worker that comes back is told to shut down and must register anew.
    _W.GONE: {},
}

# An agent process the server still talks to.
WORKER_LIVE = frozenset({_W.IDLE, _W.BUSY, _W.DRAINING})
# May lease new tasks.
WORKER_LEASABLE = frozenset({_W.IDLE, _W.BUSY})


_RK = RankState
RANK_TRANSITIONS: dict[RankState, dict[RankState, str]] = {
    _RK.RESERVED: {
        _RK.LEASED: "every rank of the gang is reserved: all start together",
        _RK.RELEASED: "the partial reservation timed out, the task was canceled, or the worker went",
    },
    _RK.LEASED: {
        _RK.RUNNING: "the agent started its rank",
        _RK.EXITED: "the agent reported the end before the start",
        _RK.STOPPING: "another rank ended: the whole gang stops",
        _RK.RELEASED: "its worker went",
    },
    _RK.RUNNING: {
        _RK.EXITED: "the agent reported how the rank ended",
        _RK.STOPPING: "another rank ended: the whole gang stops",
        _RK.RELEASED: "its worker went",
    },
    _RK.STOPPING: {
        _RK.EXITED: "the agent stopped it and reported the end",
        _RK.RELEASED: "its worker went",
    },
    _RK.EXITED: {},
    _RK.RELEASED: {},
}

# A rank that holds GPUs on its worker (no other task may use them).
RANK_HOLDING = frozenset({_RK.RESERVED, _RK.LEASED, _RK.RUNNING, _RK.STOPPING})
# A rank of the gang's current attempt that is (or is about to be) running.
RANK_ACTIVE = frozenset({_RK.LEASED, _RK.RUNNING})
RANK_FINAL = frozenset({_RK.EXITED, _RK.RELEASED})


def check_transition(
    table: Mapping[State, Mapping[State, str]], kind: str, ident: str, current: State, to: State
) -> None:
    """Raise IllegalTransition unless `current -> to` is an edge of `table`.
    Staying put is never an edge: callers that allow it say so before calling."""
    if to not in table[current]:
        raise IllegalTransition(kind, ident, current, to)
