"""Simulated agents: the moves the real agent makes, done through the real queueing
functions in-process (register with a join token, lease, start, finish, interrupt on a
drain deadline or a spot reclaim, deregister), at virtual times the simulator chooses.

The agent keeps no scheduling logic of its own: what it leases is whatever
`queueing.tasks.lease` hands it, exactly as over HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.auth.tokens import create_token
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as worker_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import Worker


@dataclass
class RunningTask:
    task_id: str
    gpus: int
    started_s: float
    attempt: int


@dataclass
class SimAgent:
    worker_id: str
    instance_id: str  # our Instance.id
    provider_instance_id: str
    pool: str
    gpus: int
    price_per_gpu_h: float
    running: dict[str, RunningTask] = field(default_factory=dict)
    draining: bool = False
    gone: bool = False
    idle_since: float | None = None  # virtual seconds; None while a task runs

    @property
    def free(self) -> int:
        return self.gpus - sum(r.gpus for r in self.running.values())


@dataclass(frozen=True)
class Ended:
    """How one attempt ended, as the queue saw it."""

    task_id: str
    gpus: int
    ran_s: float
    state: str  # the task's state after the report: succeeded, queued (requeued), failed...


class AgentOps:
    """Agent-side calls against the database, in one short transaction each."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def register(
        self,
        *,
        now: datetime,
        instance_id: str,
        provider_instance_id: str,
        pool: str,
        provider: str,
        gpus: int,
        gpu_type: str | None,
        price_per_gpu_h: float,
    ) -> SimAgent:
        with transaction(self.sessions) as s:
            _, join = create_token(s, kind="join", now=now, pool=pool)
            reg = worker_ops.Registration(
                hostname=provider_instance_id,
                instance_id=provider_instance_id,
                provider=provider,
                pool=pool,
                gpus=[{"index": i, "model": gpu_type or "GPU"} for i in range(gpus)],
                simulated_gpus=True,
                agent_version="sim",
            )
            worker, _ = worker_ops.register(s, join, reg, now=now)
            wid = worker.id
        return SimAgent(wid, instance_id, provider_instance_id, pool, gpus, price_per_gpu_h)

    def lease_and_start(self, agent: SimAgent, *, now: datetime) -> tuple[str, int, int] | None:
        """Lease one task and report it started: (task id, gpus, attempt), or None."""
        with transaction(self.sessions) as s:
            task = task_ops.lease(s, agent.worker_id, now=now)
            if task is None:
                return None
            task_ops.mark_started(s, agent.worker_id, task.id, now=now)
            return task.id, task.gpus, task.attempts

    def finish(self, agent: SimAgent, task_id: str, *, now: datetime, now_s: float, interrupted: str = "") -> Ended:
        run = agent.running.pop(task_id)
        with transaction(self.sessions) as s:
            if interrupted:
                task = task_ops.finish(s, agent.worker_id, task_id, now=now, reason="interrupted", detail=interrupted)
            else:
                task = task_ops.finish(s, agent.worker_id, task_id, now=now, reason="exit", exit_code=0)
            state = task.state
        return Ended(task_id, run.gpus, now_s - run.started_s, state)

    def preempted(self, agent: SimAgent, *, now: datetime) -> None:
        """The heartbeat that tells the server the agent saw a spot notice."""
        with transaction(self.sessions) as s:
            worker_ops.heartbeat(s, agent.worker_id, now=now, running=[], preempted=True)

    def leave(self, agent: SimAgent, *, now: datetime, reason: str) -> None:
        agent.gone = True
        with transaction(self.sessions) as s:
            worker_ops.deregister(s, agent.worker_id, now=now, reason=reason)

    def heartbeat_all(self, *, now: datetime) -> None:
        """Every live simulated agent heartbeats (one statement, not one call per worker)."""
        with transaction(self.sessions) as s:
            s.execute(update(Worker).where(Worker.state.in_(worker_ops.LIVE_STATES)).values(last_heartbeat=now))
