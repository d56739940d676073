"""Workers: what agents call (register, heartbeat, lease, start, finish, logs,
deregister) and what admins see (list, get, drain)."""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from autoscaler.api.context import AppContext
from autoscaler.api.deps import Auth, Credentials, Ctx, tx
from autoscaler.api.routes.artifacts import transfers_for
from autoscaler.api.schemas import (
    DrainIn,
    FinishIn,
    HeartbeatIn,
    HeartbeatOut,
    LeasedTaskOut,
    LeaseIn,
    LeaseOut,
    LogsIn,
    RegisterIn,
    RegisterOut,
    TaskOut,
    WorkerOut,
)
from autoscaler.artifacts import gang_checkpoints, records
from autoscaler.auth.sealing import SecretUnavailable
from autoscaler.errors import AutoscalerError, Forbidden, SecurityNote
from autoscaler.lifecycle import RANK_ACTIVE
from autoscaler.queueing import gangs
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as ops
from autoscaler.queueing.states import ACTIVE, TaskState
from autoscaler.state.models import ApiToken, Task, Worker
from providers.identity import IdentityRefused, identity_verifier

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1/workers", tags=["workers"])
HEARTBEAT_INTERVAL_S = 10.0
_ACTIVE = frozenset(s.value for s in ACTIVE)
_RANK_ACTIVE = frozenset(s.value for s in RANK_ACTIVE)
MAX_LEASE_WAIT_S = 60.0  # a long-poll lease waits at most this long (agents ask for less)


def _pool_setting(ctx: Ctx, pool: str, key: str, default: str) -> str:
    """A pool's tenancy or unused_cost, recorded on its workers for the lease gate;
    `default` for a pool the config does not name."""
    for p in ctx.config.pools:
        if p.name == pool:
            return str(getattr(p, key))
    return default


@router.post("/register", response_model=RegisterOut, status_code=201)
def register(body: RegisterIn, auth: Auth, ctx: Ctx) -> RegisterOut:
    """First registration with a one-time join token, or re-registration after an agent
    restart with the worker's own token (which is then rotated)."""
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
        retry_key=body.retry_key,
        address=body.address or None,
        tenancy=_pool_setting(ctx, body.pool, "tenancy", "team"),
        unused_cost=_pool_setting(ctx, body.pool, "unused_cost", "launcher"),
    )
    superseded: str | None = None
    with tx(ctx) as s:
        principal, row = auth.registrant(s)
        _verify_identity(ctx, reg, row, body.identity)
        if principal.kind == "join":
            worker, token = ops.register(s, row, reg, now=ctx.clock.now())
        else:
            superseded = principal.worker_id
            worker, token = ops.reregister(s, row, reg, now=ctx.clock.now())
    if superseded is not None:
        # The old worker's tokens were revoked: this process stops accepting them now.
        ctx.principals.forget_worker(superseded)
    ctx.wake("worker registered")
    return RegisterOut(
        worker_id=worker.id,
        worker_token=token,
        heartbeat_interval_s=HEARTBEAT_INTERVAL_S,
        heartbeat_timeout_s=ctx.config.reconcile.heartbeat_timeout_s,
    )


def _verify_identity(ctx: AppContext, reg: ops.Registration, token: ApiToken, evidence: dict[str, str] | None) -> None:
    """Where the pool's cloud signs the machine's identity and the pool is set up to
    check it, the claimed instance id must be the one the cloud signed."""
    pool = ctx.config.pool(reg.pool)
    if pool is None or pool.provider != reg.provider:
        return  # the token checks refuse what does not match
    verifier = identity_verifier(pool.provider, pool.options, pool.region)
    if verifier is None:
        return

    def refuse(why: str) -> Forbidden:
        return Forbidden(
            f"registration refused: {why}",
            security=SecurityNote(
                kind="registration_refused",
                detail=f"identity verification: {why}",
                token_id=token.id,
                token_kind=token.kind,
                pool=reg.pool,
                instance_id=reg.instance_id,
                worker_id=token.worker_id,
            ),
        )

    if not evidence:
        raise refuse(f"pool {reg.pool} requires the {reg.provider} instance identity document; none was sent")
    try:
        verified = verifier(evidence)
    except IdentityRefused as exc:
        raise refuse(str(exc)) from None
    if verified.instance_id != reg.instance_id:
        raise refuse(f"the signed identity is instance {verified.instance_id}, not the claimed {reg.instance_id}")


@router.post("/{worker_id}/heartbeat", response_model=HeartbeatOut)
def heartbeat(worker_id: str, body: HeartbeatIn, auth: Auth, ctx: Ctx) -> HeartbeatOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        return _heartbeat(s, ctx, worker_id, body)


def _heartbeat(session: Session, ctx: AppContext, worker_id: str, body: HeartbeatIn) -> HeartbeatOut:
    """One heartbeat, from its endpoint or carried by a lease (LeaseIn.heartbeat)."""
    reply = ops.heartbeat(
        session,
        worker_id,
        now=ctx.clock.now(),
        gpu_metrics=[m.model_dump() for m in body.gpu_metrics],
        running=list(body.running),
        draining=body.draining,
        preempted=body.preempted,
        preempt_reason=body.preempt_reason,
        preempt_deadline=body.preempt_deadline,
        gpu_sample_interval_s=ctx.config.retention.gpu_sample_interval_s,
    )
    return HeartbeatOut(
        drain=reply.drain,
        drain_deadline=reply.drain_deadline,
        cancel=reply.cancel,
        reclaim=reply.reclaim,
        shutdown=reply.shutdown,
    )


@router.post("/{worker_id}/lease", response_model=LeaseOut)
async def lease(
    worker_id: str,
    auth: Auth,
    ctx: Ctx,
    wait_s: Annotated[
        float,
        Query(
            ge=0,
            le=MAX_LEASE_WAIT_S,
            description="Long-poll: when nothing fits now, wait up to this many seconds for work "
            "(answered the moment a task fits); 0 answers at once.",
        ),
    ] = 0.0,
    body: LeaseIn | None = None,
) -> LeaseOut:
    """The best queued task that fits this worker, or `{"task": null}`.

    With `wait_s`, an empty answer waits in the server (holding no database
    connection) and is retried when work is queued (autoscaler.api.longpoll). Each
    attempt is the ordinary lease in its own transaction, so what is handed out, and
    every error, is the same as without waiting.

    With a heartbeat in the body (an idle agent's, instead of a request of its own),
    the first attempt records it first, in the same transaction; a worker the
    heartbeat tells to drain or shut down is answered at once, without a lease."""
    deadline = time.monotonic() + wait_s
    beat = body.heartbeat if body is not None else None
    commands: HeartbeatOut | None = None
    while True:
        out = await run_in_threadpool(_lease_once, worker_id, auth, ctx, beat)
        # Recorded once: a retry after a wake-up is only the lease, answered with the
        # first attempt's commands.
        beat, commands = None, out.heartbeat or commands
        out.heartbeat = commands
        left = deadline - time.monotonic()
        # A rank of a forming gang is answered at once: its agent polls for the start.
        if out.task is not None or out.reserved or left <= 0 or ctx.lease_waiters.closed:
            return out
        if commands is not None and (commands.shutdown or commands.drain):
            return out
        await ctx.lease_waiters.wait(left)


def _lease_once(worker_id: str, auth: Credentials, ctx: AppContext, beat: HeartbeatIn | None = None) -> LeaseOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        commands = _heartbeat(s, ctx, worker_id, beat) if beat is not None else None
        if commands is not None and (commands.shutdown or commands.drain):
            return LeaseOut(task=None, heartbeat=commands)  # no lease for a worker that is leaving
        task = task_ops.lease(s, worker_id, now=ctx.clock.now(), gang_settings=gang_settings(ctx))
        if task is None:
            return LeaseOut(task=None, reserved=gangs.waiting_on(s, worker_id), heartbeat=commands)
        return LeaseOut(task=leased_task(s, ctx, worker_id, task), heartbeat=commands)


def gang_settings(ctx: AppContext) -> gangs.GangSettings:
    g = ctx.config.gangs
    return gangs.GangSettings(g.reservation_timeout_s, (g.master_port_min, g.master_port_max))


def leased_task(session: Session, ctx: AppContext, worker_id: str, task: Task) -> LeasedTaskOut | None:
    """The leased task for its worker, secret env opened. A secret that does not open
    (its key was removed from the key file) fails the task now, with the reason in its
    history, instead of leaving it at the head of its queue for every poll to trip on."""
    base = TaskOut.model_validate(task).model_dump()
    rank = gangs.rank_of(session, task.id, worker_id) if gangs.is_gang(task) else None
    if rank is not None:
        # This worker's rank: its GPUs, and where the other ranks meet (docs/gangs.md).
        port_range = gang_settings(ctx).master_port_range
        base["env"] = {**base["env"], **gangs.rendezvous_env(session, task, rank, port_range=port_range)}
        base["gpu_indices"] = list(rank.gpu_indices)
        base["worker_id"] = worker_id
    try:
        base["transfers"] = transfers_for(session, ctx, worker_id, task)
    except AutoscalerError as exc:  # no store, no key, snapshot gone: the attempt cannot start
        log.error("task %s: cannot hand out its files, failing it: %s", task.id, exc.message)
        task_ops.finish(
            session, worker_id, task.id, now=ctx.clock.now(), reason="start_failed", detail=exc.message[:2000]
        )
        return None
    if not task.secret_env:
        return LeasedTaskOut(**{**base, "secret_env": {}})
    try:
        if ctx.secret_keys is None:
            raise SecretUnavailable("this server process has no secret key (server.secret_key_file)")
        opened = ctx.secret_keys.open_all(task.id, task.secret_env)
    except SecretUnavailable as exc:
        log.error("task %s: cannot open its secret env, failing it: %s", task.id, exc.message)
        task_ops.finish(
            session,
            worker_id,
            task.id,
            now=ctx.clock.now(),
            reason="start_failed",
            detail=f"secret env cannot be opened: {exc.message}"[:2000],
        )
        return None
    return LeasedTaskOut(**{**base, "secret_env": opened})


@router.post("/{worker_id}/tasks/{task_id}/start", response_model=TaskOut)
def start(worker_id: str, task_id: str, auth: Auth, ctx: Ctx) -> TaskOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        return TaskOut.model_validate(task_ops.mark_started(s, worker_id, task_id, now=ctx.clock.now()))


@router.post("/{worker_id}/tasks/{task_id}/finish", response_model=TaskOut)
def finish(worker_id: str, task_id: str, body: FinishIn, auth: Auth, ctx: Ctx) -> TaskOut:
    with tx(ctx) as s:
        auth.worker(s, worker_id)
        if body.logs and _attempt_open(s, worker_id, task_id):
            task_ops.append_logs(s, worker_id, task_id, [(c.stream, c.data) for c in body.logs], now=ctx.clock.now())
        task = task_ops.finish(
            s, worker_id, task_id, now=ctx.clock.now(), reason=body.reason, exit_code=body.exit_code, detail=body.detail
        )
        # A rank's end may end the attempt whose restore set was kept: it may go now.
        store = ctx.artifacts if gangs.is_gang(task) and task.checkpoint_dir else None
        gone = gang_checkpoints.prune(s, task) if store is not None else []
        out = TaskOut.model_validate(task)
    if store is not None:
        records.delete_objects(store, gone)
    ctx.wake("task finished")
    if out.state == TaskState.QUEUED.value:
        ctx.lease_waiters.notify(1)  # a failed attempt went back to the queue: someone may take it
    return out


def _attempt_open(session: Session, worker_id: str, task_id: str) -> bool:
    """Is this worker's attempt (or rank) of the task still running? A finish retried
    after its reply was lost has been recorded already: its output was kept then."""
    task = session.get(Task, task_id)
    if task is None or task.state not in _ACTIVE:
        return False
    if gangs.is_gang(task):
        rank = gangs.rank_of(session, task_id, worker_id)
        return rank is not None and rank.state in _RANK_ACTIVE
    return True


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
