"""The one function allowed to move a task, and the one allowed to move a worker.

Both check the change against the tables in `autoscaler.lifecycle`. Every task change
is appended to `task_events` with a reason, so a task's history always says why each
attempt ended; a worker's says it in its `drain_reason` and `gone_reason`.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from autoscaler.errors import Conflict
from autoscaler.ledger.attempts import close_attempt, open_attempt
from autoscaler.lifecycle import (
    RANK_TRANSITIONS,
    TASK_ACTIVE,
    TASK_FINAL,
    TASK_TRANSITIONS,
    WORKER_TRANSITIONS,
    IllegalTransition,
    RankState,
    TaskState,
    WorkerState,
    check_transition,
)
from autoscaler.state.lifecycle_log import note
from autoscaler.state.models import Task, TaskEvent, TaskRank, Worker

__all__ = [
    "ACTIVE",
    "FINAL",
    "TRANSITIONS",
    "RankState",
    "TaskState",
    "WorkerState",
    "move_rank",
    "move_worker",
    "transition",
]


# Re-exported under their old names: the callers' vocabulary ("ACTIVE", "FINAL").
TRANSITIONS = TASK_TRANSITIONS
ACTIVE = TASK_ACTIVE
FINAL = TASK_FINAL


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
    try:
        check_transition(TASK_TRANSITIONS, "task", task.id, current, to)
    except IllegalTransition as e:
        raise Conflict(str(e)) from None
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


def move_worker(worker: Worker, to: WorkerState) -> None:
    """Move `worker` to `to`, or raise Conflict if the table forbids it. Staying put is
    allowed (a second drain, a spot notice on a draining worker, only update reasons)."""
    current = WorkerState(worker.state)
    if current == to:
        return
    try:
        check_transition(WORKER_TRANSITIONS, "worker", worker.id, current, to)
    except IllegalTransition as e:
        raise Conflict(str(e)) from None
    worker.state = to.value


def move_rank(rank: TaskRank, to: RankState, *, now: datetime) -> None:
    """Move one rank of a gang to `to`, or raise Conflict if the table forbids it.
    Staying put is allowed (a second stop request, a retried end report)."""
    current = RankState(rank.state)
    if current == to:
        return
    try:
        check_transition(RANK_TRANSITIONS, "rank", f"{rank.task_id}/{rank.rank}", current, to)
    except IllegalTransition as e:
        raise Conflict(str(e)) from None
    rank.state = to.value
    if to in (RankState.EXITED, RankState.RELEASED):
        rank.ended_at = now
