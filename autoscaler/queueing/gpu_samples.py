"""GPU utilisation and memory over time: recorded per worker from its heartbeats, read
back per task.

A worker's heartbeat carries every GPU's utilisation and memory; at most one sample
per worker per `retention.gpu_sample_interval_s` is kept (heartbeats come every few
seconds, and a chart needs far fewer points), and the daily prune deletes samples
older than `retention.gpu_samples_days`. A task's use is the samples of its attempts:
the attempt's worker, only the GPU indices that attempt held, and only within its
time window (from the lease to the end, or now for a running one), so two tasks
sharing a machine each see their own GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.state.models import GpuSample, TaskAttempt

# At most this many points per attempt are returned (evenly thinned): a week of
# 30-second samples is 20,160 rows, more than any page or terminal can show.
MAX_POINTS = 500


def record(
    session: Session, worker_id: str, metrics: Sequence[dict[str, Any]], *, now: datetime, interval_s: float
) -> bool:
    """Keep this heartbeat's GPU figures unless the worker was sampled within `interval_s`."""
    usable = [m for m in metrics if not m.get("error")]
    if not usable:
        return False
    if interval_s > 0:
        last = session.scalar(select(func.max(GpuSample.at)).where(GpuSample.worker_id == worker_id))
        if last is not None and now - last < timedelta(seconds=interval_s):
            return False
    for m in usable:
        session.add(
            GpuSample(
                worker_id=worker_id,
                at=now,
                gpu_index=int(m["index"]),
                utilization_pct=float(m.get("utilization_pct") or 0.0),
                memory_used_mb=float(m.get("memory_used_mb") or 0.0),
                memory_total_mb=float(m.get("memory_total_mb") or 0.0),
            )
        )
    return True


@dataclass(frozen=True)
class GpuPoint:
    """One sample instant of one attempt: its GPUs taken together."""

    at: datetime
    attempt: int
    utilization_pct: float  # mean over the attempt's GPUs
    memory_used_mb: float  # summed over them
    memory_total_mb: float
    per_gpu: dict[int, float] = field(default_factory=dict)  # index -> utilisation %


@dataclass(frozen=True)
class GpuUse:
    points: list[GpuPoint]
    samples: int  # instants found before thinning

    @property
    def mean_utilization_pct(self) -> float | None:
        return round(sum(p.utilization_pct for p in self.points) / len(self.points), 1) if self.points else None

    @property
    def peak_memory_used_mb(self) -> float | None:
        return max(p.memory_used_mb for p in self.points) if self.points else None

    @property
    def memory_total_mb(self) -> float | None:
        return max(p.memory_total_mb for p in self.points) if self.points else None


def _thin(points: list[GpuPoint], limit: int) -> list[GpuPoint]:
    if len(points) <= limit:
        return points
    step = len(points) / limit
    return [points[int(i * step)] for i in range(limit - 1)] + [points[-1]]


def task_use(session: Session, task_id: str, *, now: datetime, limit: int = MAX_POINTS) -> GpuUse:
    """The task's GPU samples, attempt by attempt, oldest first."""
    attempts = session.scalars(
        select(TaskAttempt).where(TaskAttempt.task_id == task_id).order_by(TaskAttempt.attempt, TaskAttempt.id)
    )
    points: list[GpuPoint] = []
    total = 0
    for a in attempts:
        if not a.worker_id or not a.gpu_indices:
            continue  # a CPU-only attempt, or one from before samples were kept
        indices = [int(i) for i in a.gpu_indices]
        rows = session.execute(
            select(
                GpuSample.at,
                GpuSample.gpu_index,
                GpuSample.utilization_pct,
                GpuSample.memory_used_mb,
                GpuSample.memory_total_mb,
            )
            .where(
                GpuSample.worker_id == a.worker_id,
                GpuSample.gpu_index.in_(indices),
                GpuSample.at >= a.started_at,
                GpuSample.at <= (a.ended_at or now),
            )
            .order_by(GpuSample.at, GpuSample.gpu_index)
        )
        by_at: dict[datetime, list[tuple[int, float, float, float]]] = {}
        for at, index, util, used, total_mb in rows:
            by_at.setdefault(at, []).append((index, util, used, total_mb))
        mine = [
            GpuPoint(
                at=at,
                attempt=a.attempt,
                utilization_pct=round(sum(g[1] for g in gpus) / len(gpus), 1),
                memory_used_mb=sum(g[2] for g in gpus),
                memory_total_mb=sum(g[3] for g in gpus),
                per_gpu={g[0]: g[1] for g in gpus},
            )
            for at, gpus in by_at.items()
        ]
        total += len(mine)
        points.extend(_thin(mine, limit))
    return GpuUse(points=points, samples=total)
