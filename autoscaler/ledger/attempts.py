"""Task attempts: which task held which machine's GPUs, and when.

`open_attempt` and `close_attempt` are called by `queueing.states.transition`, the one
function every task state change goes through: entering `leased` opens an attempt,
leaving `leased`/`running` closes it. The machine is resolved from the worker when the
attempt opens; when it is not known yet (the reconciler links workers to instances a
cycle later), the ledger resolves it when it accrues.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.state.models import Instance, Task, TaskAttempt, Worker


def instance_of_worker(session: Session, worker_id: str) -> str | None:
    """The id of the instance a worker runs on, or None while unknown."""
    worker = session.get(Worker, worker_id)
    if worker is not None:
        found = session.scalar(
            select(Instance.id)
            .where(Instance.provider_instance_id == worker.instance_id, Instance.pool == worker.pool)
            .order_by(Instance.created_at.desc(), Instance.id)
            .limit(1)
        )
        if found is not None:
            return found
    return session.scalar(select(Instance.id).where(Instance.worker_id == worker_id).limit(1))


def open_attempt(session: Session, task: Task, *, now: datetime) -> TaskAttempt | None:
    """The task was just leased (its worker and attempt number are set). A gang's
    attempts are its ranks', opened as each is reserved (`queueing.gangs.reserve`)."""
    if (task.nodes or 1) > 1:
        return None
    row = TaskAttempt(
        task_id=task.id,
        attempt=task.attempts,
        team=task.team,
        worker_id=task.worker_id,
        instance_id=instance_of_worker(session, task.worker_id) if task.worker_id else None,
        gpus=task.gpus,
        gpu_indices=list(task.gpu_indices or []),
        started_at=now,
        ended_at=None,
        cost_usd=0.0,
        gpu_hours=0.0,
    )
    session.add(row)
    return row


def close_attempt(session: Session, task: Task, *, now: datetime) -> None:
    """The task's attempt ended (it left `leased`/`running`)."""
    for row in session.scalars(
        select(TaskAttempt).where(TaskAttempt.task_id == task.id, TaskAttempt.ended_at.is_(None))
    ):
        row.ended_at = max(now, row.started_at)


def attempts_of(session: Session, task_ids: Iterable[str]) -> dict[str, list[TaskAttempt]]:
    """Every attempt of the given tasks, oldest first."""
    ids = list(task_ids)
    out: dict[str, list[TaskAttempt]] = {t: [] for t in ids}
    for i in range(0, len(ids), 500):
        stmt = (
            select(TaskAttempt)
            .where(TaskAttempt.task_id.in_(ids[i : i + 500]))
            .order_by(TaskAttempt.attempt, TaskAttempt.id)
        )
        for row in session.scalars(stmt):
            out[row.task_id].append(row)
    return out


def task_totals(session: Session, task_ids: Iterable[str]) -> dict[str, tuple[float, float]]:
    """task id -> (cost USD, GPU-hours) over its attempts, as accrued so far."""
    return {
        t: (sum(a.cost_usd for a in rows), sum(a.gpu_hours for a in rows))
        for t, rows in attempts_of(session, task_ids).items()
    }
