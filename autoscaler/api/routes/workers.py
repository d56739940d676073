"""Workers: what agents call (register, heartbeat, lease, start, finish, logs,
deregister) and what admins see (list, get, drain)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.api.schemas import (
    DrainIn,
    FinishIn,
    HeartbeatIn,
    HeartbeatOut,
    LeaseOut,
    LogsIn,
    RegisterIn,
    RegisterOut,
    TaskOut,
    WorkerOut,
)
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as ops
from autoscaler.state.models import Worker

router = APIRouter(prefix="/api/v1/workers", tags=["workers"])
HEARTBEAT_INTERVAL_S = 10.0


@router.post("/register", response_model=RegisterOut, status_code=201)
def register(body: RegisterIn, auth: Auth, ctx: Ctx) -> RegisterOut:
    with tx(ctx) as s:
        join = auth.join(s)
        reg = ops.Registration(
            hostname=body.hostname,
            instance_id=body.instance_id,
            provider=body.provider,
            pool=body.pool,
            gpus=[g.model_dump() for g in body.gpus],
            cpus=body.cpus,
            memory_mb=body.memory_mb,
            simulated_gpus=any(g.simulated for g in body.gpus),
            agent_version=body.agent_version,
        )
        worker, token = ops.register(s, join, reg, now=ctx.clock.now())
    ctx.wake("worker registered")
    return RegisterOut(
        worker_id=worker.id,
        worker_token=token,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s=ctx.config.reconcile.heartbeat_timeout_s,
    )


@router.post("/{worker_id}/heartbeat", response_model=HeartbeatOut)
def heartbeat(worker_id: str, body: HeartbeatIn, auth: Auth, ctx: Ctx) -> HeartbeatOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        reply = ops.heartbeat(
            s,
            worker_id,
            now=ctx.clock.now(),
            gpu_metrics=[m.model_dump() for m in body.gpu_metrics],
            running=list(body.running),
            draining=body.draining,
            preempted=body.preempted,
        )
    return HeartbeatOut(
        drain=reply.drain,
        drain_deadline=reply.drain_deadline,
        cancel=reply.cancel,
        reclaim=reply.reclaim,
        shutdown=reply.shutdown,
    )


@router.post("/{worker_id}/lease", response_model=LeaseOut)
def lease(worker_id: str, auth: Auth, ctx: Ctx) -> LeaseOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        task = task_ops.lease(s, worker_id, now=ctx.clock.now())
        return LeaseOut(task=TaskOut.model_validate(task) if task else None)


@router.post("/{worker_id}/tasks/{task_id}/start", response_model=TaskOut)
def start(worker_id: str, task_id: str, auth: Auth, ctx: Ctx) -> TaskOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        return TaskOut.model_validate(task_ops.mark_started(s, worker_id, task_id, now=ctx.clock.now()))


@router.post("/{worker_id}/tasks/{task_id}/finish", response_model=TaskOut)
def finish(worker_id: str, task_id: str, body: FinishIn, auth: Auth, ctx: Ctx) -> TaskOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        task = task_ops.finish(
            s, worker_id, task_id, now=ctx.clock.now(), reason=body.reason, exit_code=body.exit_code, detail=body.detail
        )
        out = TaskOut.model_validate(task)
    ctx.wake("task finished")
    return out


@router.post("/{worker_id}/tasks/{task_id}/logs")
def append_logs(worker_id: str, task_id: str, body: LogsIn, auth: Auth, ctx: Ctx) -> dict[str, int]:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        n = task_ops.append_logs(s, worker_id, task_id, [(c.stream, c.data) for c in body.chunks], now=ctx.clock.now())
    return {"accepted": n}


@router.post("/{worker_id}/deregister", response_model=WorkerOut)
def deregister(worker_id: str, auth: Auth, ctx: Ctx) -> WorkerOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        worker = WorkerOut.model_validate(ops.deregister(s, worker_id, now=ctx.clock.now()))
    # Deregistration revoked the worker's token: this process stops accepting it now.
    ctx.principals.forget_worker(worker_id)
    ctx.wake("worker deregistered")
    return worker


@router.get("", response_model=list[WorkerOut])
def list_workers(auth: Auth, ctx: Ctx, include_gone: bool = False) -> list[Worker]:
    with tx(ctx) as s:
        auth.admin(s)
        stmt = select(Worker).order_by(Worker.registered_at.desc()).limit(1000)
        if not include_gone:
            stmt = stmt.where(Worker.state != "gone")
        return list(s.scalars(stmt))


@router.get("/{worker_id}", response_model=WorkerOut)
def get_worker(worker_id: str, auth: Auth, ctx: Ctx) -> Worker:
    with tx(ctx) as s:
        auth.admin(s)
        return ops.get_worker(s, worker_id)


@router.post("/{worker_id}/drain", response_model=WorkerOut)
def drain(worker_id: str, body: DrainIn, auth: Auth, ctx: Ctx) -> Worker:
    with tx(ctx) as s:
        auth.admin(s)
        return ops.drain(
            s,
            worker_id,
            now=ctx.clock.now(),
            deadline_s=body.deadline_s,
            reason=body.reason,
            only_if_idle=body.only_if_idle,
        )
