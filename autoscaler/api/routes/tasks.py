"""Tasks: enqueue, list, get, cancel, logs. Team members see only their team's tasks;
another team's task answers 404, so ids do not leak."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.admission.shapes import Catalog
from autoscaler.admission.why_db import why_task
from autoscaler.api.context import AppContext
from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.api.schemas import (
    GpuPointOut,
    LogChunkOut,
    TaskAttemptOut,
    TaskDetail,
    TaskEventOut,
    TaskGpuOut,
    TaskIn,
    TaskOut,
    TaskRankOut,
    TaskWhyOut,
)
from autoscaler.auth.tokens import Principal
from autoscaler.errors import Forbidden, InvalidInput, NotFound
from autoscaler.ledger.attempts import attempts_of, task_totals
from autoscaler.queueing import gangs, gpu_samples
from autoscaler.queueing import tasks as ops
from autoscaler.queueing.capacity_view import capacity_for
from autoscaler.queueing.queues import known_queue
from autoscaler.queueing.runtime_history import runtime_prior
from autoscaler.queueing.states import TaskState
from autoscaler.state.models import Task, TaskEvent

router = APIRouter(prefix="/api/v1/tasks", tags=["tasks"])


def visible_task(session: Session, principal: Principal, task_id: str, *, lock: bool = False) -> Task:
    task = session.get(Task, task_id, with_for_update=lock) if len(task_id) <= 64 else None
    if task is None or (not principal.is_admin and task.team != principal.team):
        raise NotFound(f"task {task_id} not found")
    return task


def with_costs(session: Session, tasks: list[Task]) -> list[TaskOut]:
    """Tasks as output, each with its cost and GPU-hours over all attempts (one query)."""
    totals = task_totals(session, [t.id for t in tasks])
    out = []
    for t in tasks:
        usd, gpu_h = totals.get(t.id, (0.0, 0.0))
        out.append(TaskOut.model_validate(t).model_copy(update={"cost_usd": usd, "gpu_hours": gpu_h}))
    return out


@router.post("", response_model=TaskOut, status_code=201)
def enqueue(body: TaskIn, auth: Auth, ctx: Ctx) -> Task:
    with tx(ctx) as s:
        principal = auth.user(s)
        if principal.is_admin:
            # An admin enqueues for a named team, or for the catch-all team "default".
            team = body.team or "default"
            ctx.config.check_team(team)
        else:
            if body.team and body.team != principal.team:
                raise Forbidden(f"a {principal.team} token cannot enqueue for team {body.team}")
            team = principal.team or ""
        spec = ops.TaskSpec(**body.model_dump(exclude={"team"}))
        task = ops.enqueue(
            s,
            spec,
            team=team,
            now=ctx.clock.now(),
            shapes=Catalog.from_config(ctx.config),
            secret_keys=ctx.secret_keys,
            runtime_prior=runtime_prior(ctx.config.capacity),
        )
    ctx.wake("enqueue")
    if task.state == TaskState.QUEUED.value:
        ctx.lease_waiters.notify(1)  # an agent waiting in a long-poll lease takes it now
    return task


@router.get("", response_model=list[TaskOut])
def list_tasks(
    auth: Auth,
    ctx: Ctx,
    queue: str | None = None,
    state: Annotated[list[TaskState] | None, Query()] = None,
    team: str | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[TaskOut]:
    with tx(ctx) as s:
        principal = auth.user(s)
        stmt = select(Task).order_by(Task.created_at.desc()).limit(limit)
        if not principal.is_admin:
            if team and team != principal.team:
                return []
            team = principal.team
        elif team:
            ctx.config.check_team(team)
        if team:
            stmt = stmt.where(Task.team == team)
        if queue:
            known_queue(s, queue, team=None if principal.is_admin else principal.team)  # a typo is said
            stmt = stmt.where(Task.queue == queue)
        if state:
            stmt = stmt.where(Task.state.in_([x.value for x in state]))
        return with_costs(s, list(s.scalars(stmt)))


@router.get("/{task_id}", response_model=TaskDetail)
def get_task(task_id: str, auth: Auth, ctx: Ctx) -> TaskDetail:
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id)
        events = s.scalars(select(TaskEvent).where(TaskEvent.task_id == task.id).order_by(TaskEvent.id))
        (out,) = with_costs(s, [task])
        return TaskDetail(
            **out.model_dump(),
            events=[TaskEventOut.model_validate(e) for e in events],
            attempt_costs=[TaskAttemptOut.model_validate(a) for a in attempts_of(s, [task.id])[task.id]],
            ranks=[TaskRankOut.model_validate(r) for r in gangs.all_ranks(s, task.id)],
        )


@router.get("/{task_id}/gpu", response_model=TaskGpuOut)
def gpu_use(task_id: str, auth: Auth, ctx: Ctx) -> TaskGpuOut:
    """GPU utilisation and memory of the task's GPUs over its attempts (team-visible)."""
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id)
        use = gpu_samples.task_use(s, task.id, now=ctx.clock.now())
    return task_gpu_out(task.id, use, ctx)


def task_gpu_out(task_id: str, use: gpu_samples.GpuUse, ctx: AppContext) -> TaskGpuOut:
    return TaskGpuOut(
        task_id=task_id,
        samples=use.samples,
        mean_utilization_pct=use.mean_utilization_pct,
        peak_memory_used_mb=use.peak_memory_used_mb,
        memory_total_mb=use.memory_total_mb,
        sample_interval_s=ctx.config.retention.gpu_sample_interval_s,
        retention_days=ctx.config.retention.gpu_samples_days,
        points=[GpuPointOut(**p.__dict__) for p in use.points],
    )


@router.get("/{task_id}/why", response_model=TaskWhyOut)
def why(task_id: str, auth: Auth, ctx: Ctx) -> TaskWhyOut:
    """The current reason a queued task waits (or what it does if it is not queued)."""
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id)
        answer = why_task(s, task, boot_timeouts=boot_timeouts(ctx), now=ctx.clock.now())
        capacity = capacity_for(s, task, ctx.config, now=ctx.clock.now()) if task.state == "queued" else None
        return TaskWhyOut(task_id=task.id, state=task.state, capacity=capacity, **answer.to_dict())


def boot_timeouts(ctx: AppContext) -> dict[str, float]:
    return {p.name: p.boot_timeout_s for p in ctx.config.pools}


@router.post("/{task_id}/cancel", response_model=TaskOut)
def cancel(task_id: str, auth: Auth, ctx: Ctx) -> TaskOut:
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id, lock=True)
        return with_costs(s, [ops.cancel(s, task, now=ctx.clock.now())])[0]


@router.get("/{task_id}/logs", response_model=list[LogChunkOut])
def logs(
    task_id: str,
    auth: Auth,
    ctx: Ctx,
    after: Annotated[int, Query(ge=0, le=2**63 - 1)] = 0,  # bounded: past 64 bits the driver overflows
    limit: Annotated[int, Query(ge=1, le=5000)] = 1000,
    rank: Annotated[int | None, Query(ge=0, le=255, description="Only this rank's output (a gang's).")] = None,
) -> list[LogChunkOut]:
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id)
        if rank is not None and rank >= task.nodes:
            raise InvalidInput(f"task {task.id} has {task.nodes} rank(s) (0-{task.nodes - 1}); there is no rank {rank}")
        chunks = ops.read_logs(s, task.id, after=after, limit=limit, rank=rank)
        return [LogChunkOut.model_validate(c) for c in chunks]
