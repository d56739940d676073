"""Small builders for queueing tests: real service functions, no shortcuts around them."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.admission import store as admission_store
from autoscaler.admission.model import admissions
from autoscaler.auth.tokens import create_token
from autoscaler.clock import ManualClock
from autoscaler.policy.schema import Decision
from autoscaler.queueing import tasks as ops
from autoscaler.queueing.workers import Registration, register
from autoscaler.state.db import transaction
from autoscaler.state.models import Task, Worker


def add_worker(
    sessions: sessionmaker[Session],
    clock: ManualClock,
    *,
    pool: str = "gpu-pool",
    gpus: int = 1,
    model: str = "NVIDIA A10G",
    instance_id: str | None = None,
    tenancy: str = "team",
) -> str:
    with transaction(sessions) as s:
        _, join = create_token(s, kind="join", now=clock.now(), pool=pool, ttl=timedelta(hours=1))
        reg = Registration(
            hostname="host",
            instance_id=instance_id or f"i-{join.id[:8]}",
            provider="fake",
            pool=pool,
            gpus=[{"index": i, "model": model, "uuid": f"GPU-{i}"} for i in range(gpus)],
            tenancy=tenancy,
        )
        worker, _token = register(s, join, reg, now=clock.now())
        return worker.id


def add_task(
    sessions: sessionmaker[Session], clock: ManualClock, *, queue: str = "gpu", team: str = "vision", **kw: Any
) -> str:
    with transaction(sessions) as s:
        kw.setdefault("gpus", 1 if queue != "cpu" else 0)
        spec = ops.TaskSpec(queue=queue, command=kw.pop("command", ["echo", "hi"]), **kw)
        return ops.enqueue(s, spec, team=team, now=clock.now()).id


def decide(sessions: sessionmaker[Session], clock: ManualClock, decision: Decision, **spent: float) -> None:
    """Materialise a policy decision for the lease gate, as a reconcile cycle does."""
    with transaction(sessions) as s:
        admission_store.write(s, admissions(decision, spent), now=clock.now())


def lease(sessions: sessionmaker[Session], clock: ManualClock, worker_id: str, **kw: Any) -> Task | None:
    with transaction(sessions) as s:
        return ops.lease(s, worker_id, now=clock.now(), **kw)


def get_task(sessions: sessionmaker[Session], task_id: str) -> Task:
    with sessions() as s:
        task = s.get(Task, task_id)
        assert task is not None
        return task


def get_worker(sessions: sessionmaker[Session], worker_id: str) -> Worker:
    with sessions() as s:
        worker = s.get(Worker, worker_id)
        assert worker is not None
        return worker
