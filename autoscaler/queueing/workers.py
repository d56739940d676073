"""Worker lifecycle on the server side: register, heartbeat, drain, deregister, expiry.

Worker states: idle | busy -> draining -> gone. A drain asked "only if idle" is
refused when the worker leased a task in the meantime, so scale-down never kills a
worker that just picked up work (a classic bug of the closest peer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.auth.tokens import create_token
from autoscaler.errors import Conflict, Forbidden, NotFound
from autoscaler.queueing.states import ACTIVE, TaskState
from autoscaler.queueing.tasks import LEASE_TTL, expire_leases, interrupt_worker_tasks
from autoscaler.state.models import ApiToken, Instance, Task, Worker

LIVE_STATES = ("idle", "busy", "draining")


@dataclass(frozen=True)
class Registration:
    hostname: str
    instance_id: str
    provider: str
    pool: str
    gpus: list[dict[str, Any]] = field(default_factory=list)
    cpus: int = 0
    memory_mb: int = 0
    simulated_gpus: bool = False
    agent_version: str = ""
    tenancy: str = "team"
    unused_cost: str = "launcher"


def register(session: Session, join: ApiToken, reg: Registration, *, now: datetime) -> tuple[Worker, str]:
    """Register an agent with a join token; returns the worker and its new worker token."""
    if join.pool and reg.pool != join.pool:
        raise Forbidden(f"this join token is for pool {join.pool!r}, not {reg.pool!r}")
    if join.bound_instance is not None and join.bound_instance != reg.instance_id:
        raise Forbidden("this join token was already used by another instance; ask for a new one")
    join.bound_instance = reg.instance_id
    # A retried registration from the same instance supersedes the earlier worker.
    for old in session.scalars(
        select(Worker).where(Worker.instance_id == reg.instance_id, Worker.state.in_(LIVE_STATES))
    ):
        _go(session, old, now=now, reason="re-registered")
    gpu_type = reg.gpus[0].get("model") if reg.gpus else None
    worker = Worker(
        hostname=reg.hostname[:255],
        instance_id=reg.instance_id,
        provider=reg.provider,
        pool=reg.pool,
        state="idle",
        gpus=reg.gpus,
        gpu_count=len(reg.gpus),
        gpu_type=gpu_type,
        simulated_gpus=reg.simulated_gpus,
        cpus=reg.cpus,
        memory_mb=reg.memory_mb,
        registered_at=now,
        last_heartbeat=now,
        idle_since=now,
        agent_version=reg.agent_version[:32],
        tenancy=reg.tenancy,
        unused_cost=reg.unused_cost,
    )
    session.add(worker)
    session.flush()
    instance = session.scalar(
        select(Instance).where(Instance.provider_instance_id == reg.instance_id, Instance.pool == reg.pool)
    )
    if instance is not None:
        instance.worker_id = worker.id
    plaintext, _ = create_token(session, kind="worker", now=now, pool=reg.pool, worker_id=worker.id)
    return worker, plaintext


def get_worker(session: Session, worker_id: str, *, lock: bool = False) -> Worker:
    worker = session.get(Worker, worker_id, with_for_update=lock)
    if worker is None:
        raise NotFound(f"worker {worker_id} is not registered")
    return worker


@dataclass
class HeartbeatReply:
    drain: bool
    drain_deadline: datetime | None
    cancel: list[str]
    shutdown: bool
    known_tasks: list[str]
    reclaim: list[str] = field(default_factory=list)


def heartbeat(
    session: Session,
    worker_id: str,
    *,
    now: datetime,
    gpu_metrics: list[dict[str, Any]] | None = None,
    running: list[str] | None = None,
    draining: bool = False,
    preempted: bool = False,
) -> HeartbeatReply:
    worker = get_worker(session, worker_id, lock=True)
    if worker.state == "gone":
        # The server gave up on this worker (missed heartbeats): its tasks were
        # requeued elsewhere, so the agent must stop them and shut down.
        return HeartbeatReply(False, None, list(running or []), True, [])
    worker.last_heartbeat = now
    # The agent drains by itself on SIGTERM or a spot notice; recording it keeps the
    # reconciler from counting it as capacity, and "spot" lets it mark the instance preempted.
    if preempted and worker.drain_reason != "spot":
        worker.state = "draining"
        worker.drain_reason = "spot"
        worker.drain_deadline = worker.drain_deadline or now
    elif draining and worker.state in ("idle", "busy"):
        worker.state = "draining"
        worker.drain_reason = "agent"
    if gpu_metrics is not None:
        worker.gpu_metrics = gpu_metrics[:64]
    tasks = list(
        session.scalars(select(Task).where(Task.worker_id == worker_id, Task.state.in_([s.value for s in ACTIVE])))
    )
    for t in tasks:
        if t.state == TaskState.LEASED.value:
            t.lease_deadline = now + LEASE_TTL
    known = {t.id for t in tasks}
    # Tasks the agent still runs but the server has moved on from (requeued, canceled)
    # must be stopped: they would otherwise run twice.
    cancel = [t.id for t in tasks if t.cancel_requested] + [tid for tid in (running or []) if tid not in known]
    return HeartbeatReply(
        drain=worker.state == "draining",
        drain_deadline=worker.drain_deadline,
        cancel=cancel,
        shutdown=False,
        known_tasks=sorted(known),
        reclaim=[t.id for t in tasks if t.reclaim_requested and not t.cancel_requested],
    )


def drain(
    session: Session,
    worker_id: str,
    *,
    now: datetime,
    deadline_s: float,
    reason: str,
    only_if_idle: bool = False,
) -> Worker:
    worker = get_worker(session, worker_id, lock=True)
    if worker.state == "gone":
        raise Conflict(f"worker {worker_id} is gone; nothing to drain")
    if worker.state == "draining":
        return worker
    if only_if_idle:
        busy = session.scalar(
            select(Task.id).where(Task.worker_id == worker_id, Task.state.in_([s.value for s in ACTIVE])).limit(1)
        )
        if busy is not None:
            raise Conflict(f"worker {worker_id} leased task {busy} meanwhile; not draining an idle-only drain")
    worker.state = "draining"
    worker.drain_deadline = now + timedelta(seconds=deadline_s)
    worker.drain_reason = reason
    return worker


def _go(session: Session, worker: Worker, *, now: datetime, reason: str, lost: bool = False) -> list[Task]:
    tasks = interrupt_worker_tasks(session, worker.id, now=now, reason=reason, lost=lost)
    worker.state = "gone"
    worker.gone_at = now
    worker.gone_reason = reason
    return tasks


def deregister(session: Session, worker_id: str, *, now: datetime, reason: str = "deregistered") -> Worker:
    worker = get_worker(session, worker_id, lock=True)
    if worker.state != "gone":
        _go(session, worker, now=now, reason=reason)
    # A lost worker keeps its token so that, if it comes back, its heartbeat can be
    # told to shut down; a deregistered one has nothing left to say.
    for tok in session.scalars(select(ApiToken).where(ApiToken.worker_id == worker.id)):
        tok.revoked = True
    return worker


def expire_silent_workers(session: Session, *, now: datetime, timeout_s: float) -> list[Worker]:
    """Workers silent for `timeout_s` are gone; their tasks are lost and requeued."""
    cutoff = now - timedelta(seconds=timeout_s)
    silent = list(
        session.scalars(
            select(Worker).where(Worker.state.in_(LIVE_STATES), Worker.last_heartbeat < cutoff).with_for_update()
        )
    )
    for worker in silent:
        _go(session, worker, now=now, reason="heartbeat", lost=True)
    expire_leases(session, now=now)
    return silent
