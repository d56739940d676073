"""Queues: synced from the config file at start-up, created through the API, and
summarised (depth, running, oldest wait) for the API, the planner and metrics."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.config import AutoscalerConfig
from autoscaler.errors import NotFound
from autoscaler.queueing.states import ACTIVE, TaskState
from autoscaler.state.models import QueueRow, Task


def sync_from_config(session: Session, config: AutoscalerConfig, *, now: datetime) -> None:
    """Make the queue table match the config's queues (queues created by API are kept)."""
    for q in config.queues:
        row = session.get(QueueRow, q.name)
        if row is None:
            session.add(QueueRow(name=q.name, pools=q.pools, priority=q.priority, teams=q.teams, created_at=now))
        else:
            row.pools, row.priority, row.teams = q.pools, q.priority, q.teams


@dataclass(frozen=True)
class QueueStats:
    depth: int
    running: int
    oldest_enqueued: datetime | None


def queue_stats(session: Session, team: str | None = None) -> dict[str, QueueStats]:
    stmt = (
        select(Task.queue, Task.state, func.count(), func.min(Task.sort_key))
        .where(Task.state.in_([TaskState.QUEUED.value, *[s.value for s in ACTIVE]]))
        .group_by(Task.queue, Task.state)
    )
    if team:
        stmt = stmt.where(Task.team == team)
    depth: dict[str, int] = {}
    running: dict[str, int] = {}
    oldest: dict[str, datetime] = {}
    for queue, state, n, first in session.execute(stmt):
        if state == TaskState.QUEUED.value:
            depth[queue] = n
            oldest[queue] = first
        else:
            running[queue] = running.get(queue, 0) + n
    names = set(depth) | set(running)
    return {q: QueueStats(depth.get(q, 0), running.get(q, 0), oldest.get(q)) for q in names}


def visible_queues(session: Session, team: str | None) -> list[QueueRow]:
    rows = list(session.scalars(select(QueueRow).order_by(QueueRow.priority.desc(), QueueRow.name)))
    return [r for r in rows if team is None or not r.teams or team in r.teams]


def known_queue(session: Session, name: str, *, team: str | None) -> QueueRow:
    """The queue called `name`, or a NotFound naming the queues `team` may use (every
    queue for None): enqueue and the task list's `queue` filter refuse a typo in the
    same words, rather than queueing nowhere or listing nothing."""
    row = session.get(QueueRow, name) if len(name) <= 64 else None
    if row is None:
        known = ", ".join(r.name for r in visible_queues(session, team)) or "none"
        raise NotFound(
            f"queue {name[:64]!r} does not exist (known: {known}): check the spelling, or list queues with "
            "`autoscaler queues`"
        )
    return row
