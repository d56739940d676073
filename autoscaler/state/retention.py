"""Retention: delete history older than the `retention` settings say to keep.

Task output, task state changes, reconcile decisions, chart history and GPU samples
otherwise grow with every cycle and heartbeat for as long as the deployment runs. The
server runs `prune` once at start and then every `retention.prune_interval_h` hours
(docs/operations.md#retention). What is kept: every task row, its attempts and their
cost, the spend ledger and instance histories (spend reports and audits read them),
and the output and events of tasks not yet finished, whatever their age.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, Delete, delete, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from autoscaler.config import RetentionConfig
from autoscaler.lifecycle import TASK_FINAL
from autoscaler.state.models import DecisionRecord, GpuSample, HistoryPoint, Task, TaskEvent, TaskLog

# Task states after which nothing more is written for the task.
FINISHED = tuple(sorted(TASK_FINAL))


@dataclass(frozen=True)
class Pruned:
    task_logs: int = 0
    task_events: int = 0
    decisions: int = 0
    metrics: int = 0
    gpu_samples: int = 0

    def total(self) -> int:
        return self.task_logs + self.task_events + self.decisions + self.metrics + self.gpu_samples

    def describe(self) -> str:
        return (
            f"{self.task_logs} task log chunk(s), {self.task_events} task event(s), {self.decisions} decision(s), "
            f"{self.metrics} chart point(s), {self.gpu_samples} GPU sample(s)"
        )


def _cutoff(now: datetime, days: float) -> datetime | None:
    return None if days <= 0 else now - timedelta(days=days)


def _run(session: Session, cutoff: datetime | None, statement: Callable[[datetime], Delete]) -> int:
    if cutoff is None:
        return 0  # 0 days: kept forever
    result = session.execute(statement(cutoff))
    return int(getattr(result, "rowcount", 0) or 0)


def _of_tasks_finished_before(task_id: InstrumentedAttribute[str], cutoff: datetime) -> ColumnElement[bool]:
    return task_id.in_(select(Task.id).where(Task.state.in_(FINISHED), Task.finished_at < cutoff))


def prune(session: Session, settings: RetentionConfig, *, now: datetime) -> Pruned:
    """Delete what is older than the settings keep; returns how many rows of each."""
    return Pruned(
        task_logs=_run(
            session,
            _cutoff(now, settings.task_logs_days),
            lambda c: delete(TaskLog).where(_of_tasks_finished_before(TaskLog.task_id, c)),
        ),
        task_events=_run(
            session,
            _cutoff(now, settings.task_events_days),
            lambda c: delete(TaskEvent).where(_of_tasks_finished_before(TaskEvent.task_id, c)),
        ),
        decisions=_run(
            session,
            _cutoff(now, settings.decisions_days),
            lambda c: delete(DecisionRecord).where(DecisionRecord.at < c),
        ),
        metrics=_run(
            session, _cutoff(now, settings.metrics_days), lambda c: delete(HistoryPoint).where(HistoryPoint.at < c)
        ),
        gpu_samples=_run(
            session, _cutoff(now, settings.gpu_samples_days), lambda c: delete(GpuSample).where(GpuSample.at < c)
        ),
    )
