"""The task state machine as a table, and the one function allowed to move a task.

Every change is appended to `task_events` with a reason, so a task's history always
says why each attempt ended.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy.orm import Session

from autoscaler.errors import Conflict
from autoscaler.ledger.attempts import close_attempt, open_attempt
from autoscaler.state.lifecycle import note
from autoscaler.state.models import Task, TaskEvent


class TaskState(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"
    INTERRUPTED = "interrupted"
    LOST = "lost"


Q, L, R = TaskState.QUEUED, TaskState.LEASED, TaskState.RUNNING
S, F, C, INT, X = TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED, TaskState.INTERRUPTED, TaskState.LOST

TRANSITIONS: dict[TaskState, dict[TaskState, str]] = {
    Q: {
        L: "a worker with enough free GPUs leased it",
        C: "canceled before it ran",
        F: "could not be scheduled (e.g. its queue was removed)",
    },
    L: {
        R: "the agent started the process",
        S: "finished before the start report arrived",
        Q: "exited non-zero before the start report arrived, with failed attempts left: retried",
        F: "failed to start, or exited non-zero and may not be retried",
        C: "canceled while leased",
        INT: "worker drained or preempted before start",
        X: "worker stopped heartbeating or lease expired",
    },
    R: {
        S: "exited 0",
        Q: "exited non-zero or timed out, with failed attempts left: retried behind waiting work",
        F: "exited non-zero or timed out, and may not be retried (max_attempts, retry_on_exit_codes)",
        C: "canceled: the agent stopped it",
        INT: "spot notice or drain deadline: SIGTERM to checkpoint, then requeue",
        X: "worker stopped heartbeating",
    },
    INT: {Q: "requeued at the head of its queue", F: "interrupted more than 1000 times", C: "cancel was requested"},
    X: {Q: "requeued at the head of its queue", F: "interrupted more than 1000 times", C: "cancel was requested"},
    S: {},
    F: {},
    C: {},
}

ACTIVE = frozenset({L, R})
FINAL = frozenset({S, F, C})


def transition(
    session: Session,
    task: Task,
    to: TaskState,
    *,
    reason: str,
    now: datetime,
    detail: str = "",
) -> None:
    """Move `task` to `to`, or raise Conflict if the table forbids it.

    Also keeps the ledger's attempts: entering `leased` opens one (the task holds its
    GPUs from here), leaving `leased`/`running` closes it."""
    current = TaskState(task.state)
    if to not in TRANSITIONS[current]:
        raise Conflict(f"task {task.id} is {current.value}; it cannot become {to.value}")
    session.add(
        TaskEvent(
            task_id=task.id,
            at=now,
            from_state=current.value,
            to_state=to.value,
            reason=reason,
            attempt=task.attempts,
            worker_id=task.worker_id,
            detail=detail[:2000],
        )
    )
    note(
        session,
        "task %s (team %s, attempt %d): %s -> %s: %s%s",
        task.id,
        task.team,
        task.attempts,
        current.value,
        to.value,
        reason,
        f" ({detail[:200]})" if detail else "",
        task_id=task.id,
        team=task.team,
        worker_id=task.worker_id,
    )
    if current in ACTIVE and to not in ACTIVE:
        close_attempt(session, task, now=now)
    task.state = to.value
    task.updated_at = now
    if to == TaskState.LEASED:
        open_attempt(session, task, now=now)
