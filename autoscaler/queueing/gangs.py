"""Multi-node tasks (gangs): the ranks of a task with `nodes > 1`, one per worker.

A gang is admitted whole or not at all. Leasing reserves one rank at a time on a
worker that fits (its GPUs are held from then on: no other task is offered them);
when the N-th rank is reserved the task becomes `leased` and every rank's worker is
handed its start on its next lease. A partial reservation older than the timeout is
released, so two gangs that each hold part of the fleet cannot wait on each other for
ever; gangs that already hold ranks are served first, so the one released first does
not take its workers straight back.

While reserved, a rank's GPUs are charged to the gang's team (its ledger attempt opens
at the reservation): idle GPUs held for a gang are the gang's cost, not the pool's.

`queueing.tasks` calls these helpers from lease, start, finish and cancel; ranks only
change state through `queueing.states.move_rank`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.ledger.attempts import instance_of_worker
from autoscaler.lifecycle import RANK_ACTIVE, RANK_HOLDING, RankState
from autoscaler.queueing.states import move_rank
from autoscaler.state.lifecycle_log import note
from autoscaler.state.models import Task, TaskAttempt, TaskRank, Worker

# A partial reservation older than this is released (docs/gangs.md).
DEFAULT_RESERVATION_TIMEOUT_S = 120.0
# MASTER_PORT is chosen in [low, high) from the gang's id (deterministic, so every
# rank and every retry agrees without asking anyone).
DEFAULT_MASTER_PORT_RANGE = (29500, 30500)
MAX_NODES = 256

_HOLDING = tuple(s.value for s in RANK_HOLDING)
_ACTIVE = tuple(s.value for s in RANK_ACTIVE)


@dataclass(frozen=True)
class GangSettings:
    reservation_timeout_s: float = DEFAULT_RESERVATION_TIMEOUT_S
    master_port_range: tuple[int, int] = DEFAULT_MASTER_PORT_RANGE


def is_gang(task: Task) -> bool:
    return (task.nodes or 1) > 1


def holding_on(session: Session, worker_id: str) -> list[TaskRank]:
    """Ranks that hold GPUs on this worker (reserved, running, or being stopped)."""
    return list(session.scalars(select(TaskRank).where(TaskRank.worker_id == worker_id, TaskRank.state.in_(_HOLDING))))


def current(session: Session, task: Task) -> list[TaskRank]:
    """The ranks of the gang's current (or forming) attempt, by rank: reserved,
    leased or running ones (a rank being stopped belongs to an attempt that ended)."""
    live = (RankState.RESERVED.value, *_ACTIVE)
    return list(
        session.scalars(
            select(TaskRank).where(TaskRank.task_id == task.id, TaskRank.state.in_(live)).order_by(TaskRank.rank)
        )
    )


def rank_of(session: Session, task_id: str, worker_id: str) -> TaskRank | None:
    """This worker's rank of the task that still holds GPUs (at most one per worker)."""
    return session.scalar(
        select(TaskRank)
        .where(TaskRank.task_id == task_id, TaskRank.worker_id == worker_id, TaskRank.state.in_(_HOLDING))
        .order_by(TaskRank.id.desc())
        .limit(1)
    )


def all_ranks(session: Session, task_id: str) -> list[TaskRank]:
    return list(
        session.scalars(select(TaskRank).where(TaskRank.task_id == task_id).order_by(TaskRank.attempt, TaskRank.rank))
    )


def reserving_ids(session: Session) -> list[str]:
    """Gangs holding a partial reservation now."""
    return list(session.scalars(select(TaskRank.task_id).where(TaskRank.state == RankState.RESERVED.value).distinct()))


def reserve(session: Session, task: Task, worker: Worker, gpu_indices: Sequence[int], *, now: datetime) -> TaskRank:
    """Hold one rank of `task` on `worker`; the caller completes the gang when this
    was the last one (`complete`). The rank's ledger attempt opens now."""
    used = {r.rank for r in current(session, task)}
    rank = TaskRank(
        task_id=task.id,
        attempt=task.attempts + 1,
        rank=min(set(range(len(used) + 1)) - used),
        worker_id=worker.id,
        gpu_indices=list(gpu_indices),
        state=RankState.RESERVED.value,
        reserved_at=now,
    )
    session.add(rank)
    session.add(
        TaskAttempt(
            task_id=task.id,
            attempt=task.attempts + 1,
            team=task.team,
            worker_id=worker.id,
            instance_id=instance_of_worker(session, worker.id),
            gpus=task.gpus,
            gpu_indices=list(gpu_indices),
            started_at=now,
            ended_at=None,
            cost_usd=0.0,
            gpu_hours=0.0,
        )
    )
    session.flush()
    note(
        session,
        "task %s (team %s): rank %d of %d reserved on worker %s",
        task.id,
        task.team,
        rank.rank,
        task.nodes,
        worker.id,
        task_id=task.id,
        team=task.team,
        worker_id=worker.id,
    )
    return rank


def close_rank_attempt(session: Session, rank: TaskRank, *, now: datetime) -> None:
    for row in session.scalars(
        select(TaskAttempt).where(
            TaskAttempt.task_id == rank.task_id,
            TaskAttempt.worker_id == rank.worker_id,
            TaskAttempt.attempt == rank.attempt,
            TaskAttempt.ended_at.is_(None),
        )
    ):
        row.ended_at = max(now, row.started_at)


def release(session: Session, ranks: Sequence[TaskRank], *, now: datetime, reason: str) -> list[str]:
    """Give up these ranks without an end report; returns their workers."""
    workers = []
    for rank in ranks:
        move_rank(rank, RankState.RELEASED, now=now)
        rank.end_reason = reason[:64]
        close_rank_attempt(session, rank, now=now)
        workers.append(rank.worker_id)
    return workers


TIMED_OUT = "reservation timeout"


def stale_reservations(session: Session, *, now: datetime, timeout_s: float) -> dict[str, list[TaskRank]]:
    """Gangs whose oldest reserved rank is older than `timeout_s`: task id -> its ranks."""
    cutoff = now - timedelta(seconds=timeout_s)
    old = set(
        session.scalars(
            select(TaskRank.task_id).where(TaskRank.state == RankState.RESERVED.value, TaskRank.reserved_at < cutoff)
        )
    )
    out: dict[str, list[TaskRank]] = {}
    for task_id in sorted(old):
        out[task_id] = list(
            session.scalars(
                select(TaskRank).where(TaskRank.task_id == task_id, TaskRank.state == RankState.RESERVED.value)
            )
        )
    return out


def complete(session: Session, ranks: Sequence[TaskRank], *, now: datetime) -> None:
    """Every rank is reserved: they are all leased (each worker gets its start)."""
    for rank in ranks:
        move_rank(rank, RankState.LEASED, now=now)


def waiting_on(session: Session, worker_id: str) -> bool:
    """Does this worker hold a rank of a gang that is still being reserved?"""
    return (
        session.scalar(
            select(TaskRank.id)
            .where(TaskRank.worker_id == worker_id, TaskRank.state == RankState.RESERVED.value)
            .limit(1)
        )
        is not None
    )


def pending_start(session: Session, worker_id: str) -> TaskRank | None:
    """A rank of a complete gang whose worker has not been handed its start yet."""
    return session.scalar(
        select(TaskRank)
        .where(
            TaskRank.worker_id == worker_id,
            TaskRank.state == RankState.LEASED.value,
            TaskRank.delivered_at.is_(None),
        )
        .order_by(TaskRank.id)
        .limit(1)
    )


def unstarted(session: Session, task: Task) -> list[TaskRank]:
    """Ranks of the gang handed their start (or not yet) that never reported it."""
    return list(
        session.scalars(select(TaskRank).where(TaskRank.task_id == task.id, TaskRank.state == RankState.LEASED.value))
    )


def stop_others(session: Session, task: Task, ended: TaskRank | None, *, now: datetime) -> list[TaskRank]:
    """The gang's attempt ended: every other rank still leased or running is told to
    stop (the worker's heartbeat lists it in `cancel`: SIGTERM, the grace, then KILL),
    and keeps its GPUs until its agent reports the end; a reserved one is released."""
    stopped = []
    for rank in session.scalars(select(TaskRank).where(TaskRank.task_id == task.id, TaskRank.state.in_(_HOLDING))):
        if ended is not None and rank.id == ended.id:
            continue
        if rank.state == RankState.RESERVED.value or (
            rank.state == RankState.LEASED.value and rank.delivered_at is None
        ):
            # Never handed to its agent: nothing runs there to stop.
            release(session, [rank], now=now, reason="gang ended")
        elif rank.state in _ACTIVE:
            move_rank(rank, RankState.STOPPING, now=now)
            stopped.append(rank)
    return stopped


def released_workers(session: Session, task: Task) -> list[str]:
    """Workers of this gang's ranks that hold nothing of it any more (to mark idle)."""
    return sorted(
        set(
            session.scalars(
                select(TaskRank.worker_id).where(
                    TaskRank.task_id == task.id, TaskRank.state == RankState.RELEASED.value
                )
            )
        )
    )


def master_port(gang_id: str, port_range: tuple[int, int] = DEFAULT_MASTER_PORT_RANGE) -> int:
    """A port in `[low, high)` every rank derives from the gang's id alone."""
    low, high = port_range
    span = max(high - low, 1)
    return low + int.from_bytes(hashlib.sha256(gang_id.encode()).digest()[:4], "big") % span


def rendezvous_env(
    session: Session, task: Task, rank: TaskRank, *, port_range: tuple[int, int] = DEFAULT_MASTER_PORT_RANGE
) -> dict[str, str]:
    """What torchrun (and any other launcher) needs to find the other ranks."""
    zero = session.scalar(
        select(TaskRank).where(TaskRank.task_id == task.id, TaskRank.attempt == rank.attempt, TaskRank.rank == 0)
    )
    master = session.get(Worker, zero.worker_id) if zero is not None else None
    addr = (master.address or master.hostname) if master is not None else ""
    return {
        "NNODES": str(task.nodes),
        "NODE_RANK": str(rank.rank),
        "GPUS_PER_NODE": str(task.gpus),
        "WORLD_SIZE": str(task.nodes * task.gpus),
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(master_port(task.id, port_range)),
        "AUTOSCALER_GANG_ID": task.id,
    }
