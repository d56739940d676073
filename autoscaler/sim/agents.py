"""Simulated agents: the moves the real agent makes, done through the real queueing
functions in-process (register with a join token, lease, start, finish, interrupt on a
drain deadline or a spot reclaim, deregister), at virtual times the simulator chooses.

The agent keeps no scheduling logic of its own: what it leases is whatever
`queueing.tasks.lease` hands it, exactly as over HTTP. That includes gangs: a lease
answer that reserves a rank (`Reserved`: the worker's GPUs are held, nothing starts),
and the start of a complete gang's rank (`Leased` with `nodes` > 1), which the real
agent gets on its next lease (it polls every 0.25 s while it holds a reservation).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.auth.tokens import create_token
from autoscaler.lifecycle import RankState
from autoscaler.queueing import gangs
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as worker_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import TaskRank, Worker


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
    # Gang ranks reserved here and not started yet: task id -> (rank row id, GPUs held).
    reserved: dict[str, tuple[int, int]] = field(default_factory=dict)
    draining: bool = False
    gone: bool = False
    idle_since: float | None = None  # virtual seconds; None while a task runs

    @property
    def free(self) -> int:
        return self.gpus - sum(r.gpus for r in self.running.values()) - sum(g for _, g in self.reserved.values())

    @property
    def busy(self) -> bool:
        """Running something or holding a rank: not idle (the server's rule too)."""
        return bool(self.running or self.reserved)


@dataclass(frozen=True)
class Leased:
    """A task started on this worker: a single task, or this worker's rank of a gang.
    `starting` are the gang's other workers whose start is waiting for their lease."""

    task_id: str
    gpus: int  # on this worker
    attempt: int
    nodes: int = 1
    starting: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reserved:
    """The lease reserved a rank of a gang here; the gang is not complete yet."""

    task_id: str
    rank_id: int
    gpus: int


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
        tenancy: str = "team",
        unused_cost: str = "launcher",
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
                tenancy=tenancy,
                unused_cost=unused_cost,
            )
            worker, _ = worker_ops.register(s, join, reg, now=now)
            wid = worker.id
        return SimAgent(wid, instance_id, provider_instance_id, pool, gpus, price_per_gpu_h)

    def lease_and_start(
        self, agent: SimAgent, *, now: datetime, gangs_queued: bool = False
    ) -> Leased | Reserved | None:
        """Lease once and report a start: what it started, the rank it reserved, or None.

        `gangs_queued`: a gang may be waiting, so a None from the lease may have been a
        reservation; without one, the extra look is skipped (most leases)."""
        with transaction(self.sessions) as s:
            task = task_ops.lease(s, agent.worker_id, now=now)
            if task is None:
                if not gangs_queued:
                    return None
                known = [r for r, _ in agent.reserved.values()]
                rank = s.scalar(
                    select(TaskRank).where(
                        TaskRank.worker_id == agent.worker_id,
                        TaskRank.state == RankState.RESERVED.value,
                        TaskRank.id.not_in(known),
                    )
                )
                return Reserved(rank.task_id, rank.id, len(rank.gpu_indices or [])) if rank is not None else None
            task_ops.mark_started(s, agent.worker_id, task.id, now=now)
            if not gangs.is_gang(task):
                return Leased(task.id, task.gpus, task.attempts)
            waiting = tuple(
                r.worker_id
                for r in gangs.current(s, task)
                if r.worker_id != agent.worker_id and r.state == RankState.LEASED.value and r.delivered_at is None
            )
            return Leased(task.id, task.gpus, task.attempts, task.nodes, waiting)

    def reserved_on(self, task_id: str) -> dict[str, tuple[int, int, datetime]]:
        """This gang's reserved ranks now (a timeout or a lost worker releases them):
        worker id -> (rank row id, GPUs, reserved at)."""
        with self.sessions() as s:
            rows = s.scalars(
                select(TaskRank).where(TaskRank.task_id == task_id, TaskRank.state == RankState.RESERVED.value)
            )
            return {r.worker_id: (r.id, len(r.gpu_indices or []), r.reserved_at) for r in rows}

    def finish(
        self,
        agent: SimAgent,
        task_id: str,
        *,
        now: datetime,
        now_s: float,
        interrupted: str = "",
        canceled: bool = False,
    ) -> Ended:
        """Report the attempt's end: an exit 0, an interruption (`interrupted`: spot,
        drain...), or, `canceled`, a rank the server told to stop because another rank
        of its gang ended (the real agent's report after SIGTERM)."""
        run = agent.running.pop(task_id)
        with transaction(self.sessions) as s:
            if canceled:
                task = task_ops.finish(s, agent.worker_id, task_id, now=now, reason="canceled", detail="gang ended")
            elif interrupted:
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
