"""Worker lifecycle on the server side: register, heartbeat, drain, deregister, expiry.

Worker states: idle | busy -> draining -> gone. A drain asked "only if idle" is
refused when the worker leased a task in the meantime, so scale-down never kills a
worker that just picked up work (a classic bug of the closest peer).

Reclaims, on every cloud: a spot notice, from the agent's metadata watcher (the
heartbeat's `preempted`) or from the provider's interruption events, drains the worker
with `drain_reason = "spot"` and the notice's deadline and moves its instance to
`draining` with the notice's words; when that worker goes (it deregisters after its
tasks checkpointed, or falls silent as the machine is taken), the instance becomes
`preempted` -- not `lost` -- with the same words. A rebalance recommendation (a risk,
not a reclaim) only stops new leases: running tasks go on unless a deadline is configured.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import CompoundSelect, bindparam, func, null, select, union_all, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autoscaler.auth import security
from autoscaler.auth.tokens import create_token
from autoscaler.errors import Conflict, Forbidden, NotFound, SecurityNote
from autoscaler.lifecycle import (
    INSTANCE_ENDED,
    INSTANCE_RUNNING,
    RANK_ACTIVE,
    RANK_HOLDING,
    TASK_ACTIVE,
    WORKER_LEASABLE,
    WORKER_LIVE,
    RankState,
    WorkerState,
)
from autoscaler.queueing import gangs, gpu_samples
from autoscaler.queueing.states import ACTIVE, TaskState, move_worker
from autoscaler.queueing.tasks import LEASE_TTL, expire_leases, interrupt_worker_tasks
from autoscaler.reconciler.states import InstanceState, transition
from autoscaler.state.launches import gang_rows
from autoscaler.state.lifecycle_log import note
from autoscaler.state.models import ApiToken, Instance, InstanceEvent, JoinUse, Task, TaskRank, Worker

LIVE_STATES = WORKER_LIVE  # kept under its old name for the simulator
SPOT = "spot"  # drain_reason of a worker whose machine got a spot notice
REBALANCE = "rebalance"  # drain_reason of a worker drained for a rebalance recommendation
NOTICE_PREFIX = "spot notice"
# A rebalance drain without a configured deadline: "never", in practice. Running tasks
# finish (or the interruption notice that may follow brings the deadline forward).
REBALANCE_NO_DEADLINE_S = 7 * 24 * 3600.0
_OPEN = INSTANCE_RUNNING
_RANK_ACTIVE = {s.value for s in RANK_ACTIVE}
_TASK_ACTIVE = {s.value for s in TASK_ACTIVE}


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
    # The machine's private address (a gang's MASTER_ADDR when it holds rank 0).
    address: str | None = None
    # A random secret the agent process keeps in memory: it lets that process, and only
    # it, retry a join whose answer it lost (the join token alone is then spent).
    retry_key: str | None = None


# Instances whose machine cannot be the one registering now.
_ENDED_INSTANCE_STATES = INSTANCE_ENDED


def _refuse(reg: Registration, token: ApiToken, kind: str, message: str, detail: str) -> Forbidden:
    return Forbidden(
        message,
        security=SecurityNote(
            kind=kind,
            detail=detail,
            token_id=token.id,
            token_kind=token.kind,
            pool=reg.pool,
            instance_id=reg.instance_id,
            worker_id=token.worker_id,
        ),
    )


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _is_retry(join: ApiToken, reg: Registration, key_hash: str | None) -> bool:
    """The agent process that consumed the token, asking again (same instance, same key)."""
    return (
        key_hash is not None
        and join.retry_key_hash is not None
        and hmac.compare_digest(join.retry_key_hash, key_hash)
        and join.bound_instance == reg.instance_id
    )


def _replay(reg: Registration, join: ApiToken) -> Forbidden:
    return _refuse(
        reg,
        join,
        "join_replay",
        "this join token was already used; a join token registers once "
        "(a restarted agent re-registers with its worker token)",
        f"consumed join token presented again (bound to {join.bound_instance})",
    )


def _check_pool_and_provider(join: ApiToken, reg: Registration) -> None:
    refused = "registration_refused"
    if join.pool and reg.pool != join.pool:
        raise _refuse(
            reg,
            join,
            refused,
            f"this join token is for pool {join.pool!r}, not {reg.pool!r}",
            f"join token for pool {join.pool} presented for pool {reg.pool}",
        )
    if join.provider and reg.provider != join.provider:
        raise _refuse(
            reg,
            join,
            refused,
            f"this join token is for a {join.provider} machine, not {reg.provider!r}",
            f"join token for provider {join.provider} presented by provider {reg.provider}",
        )


def check_join_binding(session: Session, join: ApiToken, reg: Registration) -> Instance | None:
    """Refuse (403, with a security note) a registration whose claimed identity is not
    what the join token was minted for; returns the launch's Instance row, if any."""
    _check_pool_and_provider(join, reg)
    refused = "registration_refused"
    launch: Instance | None = None
    if join.request_id:
        launch = session.scalar(select(Instance).where(Instance.request_id == join.request_id))
        if launch is None or launch.pool != reg.pool:
            raise _refuse(
                reg,
                join,
                refused,
                "this join token's launch is unknown or in another pool; ask for a new one",
                f"launch {join.request_id} not found in pool {reg.pool}",
            )
        if launch.state in _ENDED_INSTANCE_STATES:
            raise _refuse(
                reg,
                join,
                refused,
                f"the launch this join token was made for is {launch.state}",
                f"launch {join.request_id} is {launch.state}",
            )
        if launch.provider_instance_id and launch.provider_instance_id != reg.instance_id:
            raise _refuse(
                reg,
                join,
                refused,
                "this join token was made for another instance; the claimed instance id does not match the launch",
                f"claimed instance {reg.instance_id}, launch {join.request_id} is {launch.provider_instance_id}",
            )
    # An instance id that belongs to another launch (of this pool or any other) is never
    # this token's to claim.
    other = session.scalar(
        select(Instance).where(Instance.provider_instance_id == reg.instance_id).limit(1)
        if launch is None
        else select(Instance).where(Instance.provider_instance_id == reg.instance_id, Instance.id != launch.id).limit(1)
    )
    if other is not None and (launch is not None or other.pool != reg.pool):
        raise _refuse(
            reg,
            join,
            refused,
            "the claimed instance id belongs to another launch; registration refused",
            f"claimed instance {reg.instance_id} of pool {other.pool} (launch {other.request_id})",
        )
    return launch


def register(session: Session, join: ApiToken, reg: Registration, *, now: datetime) -> tuple[Worker, str]:
    """Register an agent with a join token; returns the worker and its new worker token.

    The token is consumed atomically by the first registration that passes the
    binding checks (a conditional UPDATE: of two concurrent ones, one matches no row).
    Any later presentation is a replay and is refused, except a retry by the same
    agent process (same instance, same retry key) whose answer was lost.
    """
    if join.max_uses > 1:
        return _register_with_gang_token(session, join, reg, now=now)
    key_hash = _digest(reg.retry_key) if reg.retry_key else None
    if join.used_at is not None and not _is_retry(join, reg, key_hash):
        raise _replay(reg, join)  # spent before this request began: a replay, whatever it claims
    launch = check_join_binding(session, join, reg)
    consumed = session.execute(
        update(ApiToken)
        .where(ApiToken.id == join.id, ApiToken.used_at.is_(None), ApiToken.revoked.is_(False))
        .values(used_at=now, bound_instance=reg.instance_id, retry_key_hash=key_hash)
        .execution_options(synchronize_session=False)
    )
    session.refresh(join)
    retry_of: str | None = None
    if consumed.rowcount != 1:  # type: ignore[attr-defined]
        # Spent meanwhile (a concurrent registration won) or before: only its own retry passes.
        if not _is_retry(join, reg, key_hash):
            raise _replay(reg, join)
        retry_of = join.worker_id
    worker, plaintext = _take_instance(session, join, reg, retry_of, launch, now=now, what="join token")
    join.worker_id = worker.id
    return worker, plaintext


def _take_instance(
    session: Session,
    join: ApiToken,
    reg: Registration,
    retry_of: str | None,
    launch: Instance | None,
    *,
    now: datetime,
    what: str,
) -> tuple[Worker, str]:
    """A new worker for the claimed instance: refused while another live worker holds
    it; the same agent's earlier worker (`retry_of`, a retry whose answer was lost) is
    retired first. Shared by single and gang join tokens."""
    for old in session.scalars(
        select(Worker).where(Worker.instance_id == reg.instance_id, Worker.state.in_(LIVE_STATES)).with_for_update()
    ):
        if old.id != retry_of:
            raise _refuse(
                reg,
                join,
                "registration_refused",
                f"instance {reg.instance_id} already has a live worker ({old.id}); a restarted agent "
                "re-registers with its worker token, or deregister that worker first",
                f"{what} claimed instance {reg.instance_id} of live worker {old.id}",
            )
    if retry_of is not None:
        old_worker = session.get(Worker, retry_of)
        if old_worker is not None:
            _retire(session, old_worker, now=now)
    return _new_worker(session, reg, now=now, launch=launch)


def reregister(session: Session, token: ApiToken, reg: Registration, *, now: datetime) -> tuple[Worker, str]:
    """Re-register a machine whose agent restarted, with that worker's own token.

    The claimed identity must be the worker's (same instance, pool and provider). The
    old worker is gone (`re-registered`), its tokens are revoked (the one presented
    atomically: of two concurrent re-registrations one fails) and a new worker with a
    new token takes its place."""
    old = session.get(Worker, token.worker_id, with_for_update=True) if token.worker_id else None
    if old is None:
        raise _refuse(
            reg,
            token,
            "registration_refused",
            "this worker token names no worker",
            "worker token without a worker presented for re-registration",
        )
    if (reg.instance_id, reg.pool, reg.provider) != (old.instance_id, old.pool, old.provider):
        raise _refuse(
            reg,
            token,
            "registration_refused",
            "a worker token re-registers only its own machine (same instance id, pool and provider)",
            f"worker token of {old.id} ({old.provider}/{old.pool}/{old.instance_id}) claimed "
            f"{reg.provider}/{reg.pool}/{reg.instance_id}",
        )
    launch = session.scalar(
        select(Instance)
        .where(
            (Instance.worker_id == old.id)
            | ((Instance.provider_instance_id == old.instance_id) & (Instance.pool == old.pool))
        )
        .order_by(Instance.created_at.desc())
        .limit(1)
    )
    if launch is not None and launch.state in _ENDED_INSTANCE_STATES:
        raise _refuse(
            reg,
            token,
            "registration_refused",
            f"the instance of this worker is {launch.state}; it cannot register again",
            f"worker token of {old.id} presented for re-registration of {launch.state} instance {old.instance_id}",
        )
    revoked = session.execute(
        update(ApiToken)
        .where(ApiToken.id == token.id, ApiToken.revoked.is_(False))
        .values(revoked=True)
        .execution_options(synchronize_session=False)
    )
    if revoked.rowcount != 1:  # type: ignore[attr-defined]
        raise _refuse(
            reg,
            token,
            "worker_token_replay",
            "this worker token was already used to re-register",
            f"worker token of {old.id} presented again while re-registering",
        )
    _retire(session, old, now=now)
    return _new_worker(session, reg, now=now, launch=launch)


def expel_impostors(session: Session, launch: Instance, *, now: datetime) -> list[str]:
    """Once the provider reports the launch's instance id: a worker that registered with
    this launch's join token before that, claiming another instance id, was not that
    machine. It is deregistered (its tasks requeued, its tokens revoked) and recorded.
    Returns the expelled worker ids."""
    expelled: list[str] = []
    if not launch.provider_instance_id:
        return expelled
    if launch.launch_request_id is not None:
        return _expel_gang_impostors(session, launch, now=now)
    for join in session.scalars(
        select(ApiToken).where(
            ApiToken.kind == "join",
            ApiToken.request_id == launch.request_id,
            ApiToken.used_at.is_not(None),
            ApiToken.max_uses == 1,
        )
    ):
        if join.bound_instance == launch.provider_instance_id or not join.worker_id:
            continue
        worker = session.get(Worker, join.worker_id)
        if worker is None:
            continue
        deregister(session, worker.id, now=now, reason="impostor")
        security.record(
            session,
            SecurityNote(
                kind=security.LAUNCH_MISMATCH,
                detail=(
                    f"worker {worker.id} registered as {join.bound_instance} with the join token of launch "
                    f"{launch.request_id}, which the provider reports as {launch.provider_instance_id}; deregistered"
                ),
                token_id=join.id,
                token_kind="join",
                pool=launch.pool,
                instance_id=join.bound_instance,
                worker_id=worker.id,
            ),
            now=now,
        )
        expelled.append(worker.id)
    return expelled


def _retire(session: Session, old: Worker, *, now: datetime) -> None:
    if old.state in LIVE_STATES:
        _go(session, old, now=now, reason="re-registered")
    for tok in session.scalars(select(ApiToken).where(ApiToken.worker_id == old.id, ApiToken.kind == "worker")):
        tok.revoked = True


def _new_worker(session: Session, reg: Registration, *, now: datetime, launch: Instance | None) -> tuple[Worker, str]:
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
        address=reg.address[:255] if reg.address else None,
    )
    session.add(worker)
    session.flush()
    instance = session.scalar(
        select(Instance).where(Instance.provider_instance_id == reg.instance_id, Instance.pool == reg.pool)
    )
    if instance is None and launch is not None and launch.provider_instance_id == reg.instance_id:
        instance = launch
    if instance is not None:
        instance.worker_id = worker.id
    note(
        session,
        "worker %s (%s, pool %s, %d GPU(s)) registered%s",
        worker.id,
        worker.hostname,
        worker.pool,
        worker.gpu_count,
        f" for instance {instance.id}" if instance is not None else "",
        worker_id=worker.id,
        pool=worker.pool,
    )
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


# The heartbeat is the most frequent call there is (every agent, every 10 s), so it is
# two prebuilt Core statements, not ORM loads: touch the worker (the UPDATE's row lock
# serialises it with whatever else changes the worker, as SELECT ... FOR UPDATE did)
# and read what runs on it. Anything rarer (a spot notice, the agent's own drain, a
# gang rank to give up) loads the ORM rows it changes and goes the usual way.
_TOUCH = (
    update(Worker)
    .where(Worker.id == bindparam("wid"), Worker.state != WorkerState.GONE.value)
    .values(last_heartbeat=bindparam("now"))
    .returning(Worker.state, Worker.drain_deadline, Worker.drain_reason)
)
_TOUCH_METRICS = _TOUCH.values(gpu_metrics=bindparam("metrics"))
# The tasks the worker holds, and its ranks of gangs with their gang's state and flags
# (`rank_id` None: a single task), in one round trip.
_HELD: CompoundSelect[str, str, bool, bool, int | None, str | None] = union_all(
    select(
        Task.id,
        Task.state,
        Task.cancel_requested,
        Task.reclaim_requested,
        null().label("rank_id"),
        null().label("rank_state"),
    ).where(Task.worker_id == bindparam("wid"), Task.state.in_([s.value for s in ACTIVE])),
    select(
        TaskRank.task_id,
        Task.state,
        Task.cancel_requested,
        Task.reclaim_requested,
        TaskRank.id,
        TaskRank.state,
    )
    .select_from(TaskRank)
    .outerjoin(Task, Task.id == TaskRank.task_id)
    .where(TaskRank.worker_id == bindparam("wid"), TaskRank.state.in_([s.value for s in RANK_HOLDING])),
)


def heartbeat(
    session: Session,
    worker_id: str,
    *,
    now: datetime,
    gpu_metrics: list[dict[str, Any]] | None = None,
    running: list[str] | None = None,
    draining: bool = False,
    preempted: bool = False,
    preempt_reason: str = "",
    preempt_deadline: datetime | None = None,
    gpu_sample_interval_s: float | None = None,
) -> HeartbeatReply:
    """Record the worker alive; with `gpu_sample_interval_s`, its GPU figures are also kept
    as history (at most one sample per that interval; None: only the latest is kept)."""
    # Through the session, not its connection: it flushes pending changes first (a
    # caller's unflushed task flags must be what this heartbeat reads) and keeps a
    # worker the session holds in step with the UPDATE.
    params: dict[str, Any] = {"wid": worker_id, "now": now}
    if gpu_metrics is not None:
        params["metrics"] = gpu_metrics[:64]
    touched = session.execute(_TOUCH_METRICS if gpu_metrics is not None else _TOUCH, params).one_or_none()
    if touched is None:
        if session.scalar(select(Worker.state).where(Worker.id == worker_id)) is None:
            raise NotFound(f"worker {worker_id} is not registered")
        # The server gave up on this worker (missed heartbeats): its tasks were
        # requeued elsewhere, so the agent must stop them and shut down.
        return HeartbeatReply(False, None, list(running or []), True, [])
    state, drain_deadline, drain_reason = touched
    # The agent drains by itself on SIGTERM or a spot notice; recording it keeps the
    # reconciler from counting it as capacity, and "spot" marks the instance preempted
    # once the worker is gone.
    if (preempted and drain_reason != SPOT) or (draining and state in WORKER_LEASABLE):
        worker = get_worker(session, worker_id, lock=True)
        worker.last_heartbeat = now  # as the UPDATE wrote it, should the session have held the row
        if preempted and worker.drain_reason != SPOT:
            words = (preempt_reason or "the cloud is taking the machine").strip()
            spot_notice(
                session, worker, now=now, deadline=preempt_deadline, reason=f"{NOTICE_PREFIX} from the agent: {words}"
            )
        elif draining and worker.state in WORKER_LEASABLE:
            move_worker(worker, WorkerState.DRAINING)
            worker.drain_reason = "agent"
        state, drain_deadline = worker.state, worker.drain_deadline
    if gpu_metrics is not None and gpu_sample_interval_s is not None:
        gpu_samples.record(session, worker_id, gpu_metrics[:64], now=now, interval_s=gpu_sample_interval_s)
    held: dict[str, tuple[str, bool, bool]] = {}  # task id -> state, cancel_requested, reclaim_requested
    for task_id, task_state, cancel_requested, reclaim_requested, rank_id, rank_state in session.execute(
        _HELD, {"wid": worker_id}
    ):
        if rank_id is None:
            held[task_id] = (task_state, bool(cancel_requested), bool(reclaim_requested))
        elif rank_state in _RANK_ACTIVE:
            # Its ranks of gangs: one of the running attempt is known; one being stopped
            # is not (so the agent, which still runs it, is told to stop it), and is
            # given up once the agent no longer runs it.
            if task_state in _TASK_ACTIVE:
                held[task_id] = (task_state, bool(cancel_requested), bool(reclaim_requested))
        elif rank_state == RankState.STOPPING.value and running is not None and task_id not in running:
            rank = session.get(TaskRank, rank_id)
            if rank is not None:
                gangs.release(session, [rank], now=now, reason="stopped")
    # An agent lists a task from the moment its lease answer arrives, so a leased task its
    # heartbeat leaves out is one whose answer was lost (a timeout, a reset): its deadline
    # is left to run out (housekeeping requeues it), not renewed by every heartbeat of an
    # agent that will never start it.
    leased = [
        tid
        for tid, (st, _c, _r) in held.items()
        if st == TaskState.LEASED.value and (running is None or tid in running)
    ]
    if leased:
        session.execute(
            update(Task)
            .where(Task.id.in_(leased), Task.state == TaskState.LEASED.value)
            .values(lease_deadline=now + LEASE_TTL)
            .execution_options(synchronize_session="fetch")
        )
    # Tasks the agent still runs but the server has moved on from (requeued, canceled)
    # must be stopped: they would otherwise run twice.
    cancel = [tid for tid, (_s, c, _r) in held.items() if c] + [tid for tid in (running or []) if tid not in held]
    return HeartbeatReply(
        drain=state == WorkerState.DRAINING,
        drain_deadline=drain_deadline,
        cancel=cancel,
        shutdown=False,
        known_tasks=sorted(held),
        reclaim=[tid for tid, (_s, c, r) in held.items() if r and not c],
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
    if worker.state == WorkerState.GONE:
        raise Conflict(f"worker {worker_id} is gone; nothing to drain")
    if worker.state == WorkerState.DRAINING:
        return worker
    if only_if_idle:
        busy = session.scalar(
            select(Task.id).where(Task.worker_id == worker_id, Task.state.in_([s.value for s in ACTIVE])).limit(1)
        )
        ranks = gangs.holding_on(session, worker_id)
        busy = busy or (ranks[0].task_id if ranks else None)
        if busy is not None:
            raise Conflict(f"worker {worker_id} leased task {busy} meanwhile; not draining an idle-only drain")
    move_worker(worker, WorkerState.DRAINING)
    worker.drain_deadline = now + timedelta(seconds=deadline_s)
    worker.drain_reason = reason
    note(
        session,
        "worker %s (%s, pool %s) draining within %.0f s: %s",
        worker.id,
        worker.hostname,
        worker.pool,
        deadline_s,
        reason,
        worker_id=worker.id,
        pool=worker.pool,
    )
    return worker


def _instance_of(session: Session, worker: Worker) -> Instance | None:
    """The open instance row this worker runs on (None on static machines)."""
    return session.scalar(
        select(Instance)
        .where(
            Instance.pool == worker.pool,
            Instance.provider_instance_id == worker.instance_id,
            Instance.state.in_(_OPEN),
        )
        .limit(1)
    )


def spot_notice(session: Session, worker: Worker, *, now: datetime, deadline: datetime | None, reason: str) -> None:
    """The machine under `worker` is being reclaimed: no new leases, the drain's deadline
    is the notice's (never later than one it already has), and the instance's history
    says why. The instance becomes `preempted` when the worker goes (see `_go`)."""
    move_worker(worker, WorkerState.DRAINING)
    worker.drain_reason = SPOT
    if deadline is not None and deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=UTC)  # a notice's time is UTC
    when = deadline or now
    worker.drain_deadline = min(worker.drain_deadline, when) if worker.drain_deadline is not None else when
    inst = _instance_of(session, worker)
    if inst is not None and inst.state == InstanceState.READY:
        transition(session, inst, InstanceState.DRAINING, reason=reason, now=now)


def interruption_notice(
    session: Session,
    inst: Instance,
    kind: str,
    deadline: datetime | None,
    detail: str = "",
    *,
    now: datetime,
    rebalance_deadline_s: float | None = None,
) -> bool:
    """A provider's interruption event for `inst` (the reconciler's second signal beside
    the agent's own watcher). An `interruption` is a spot notice; a `rebalance`
    recommendation drains the worker so it gets no new tasks (the planner stops counting
    it, so queued work gets a replacement) while running tasks go on until
    `rebalance_deadline_s` (None: they are not interrupted). True when anything changed."""
    if inst.worker_id is None or inst.state not in (InstanceState.READY, InstanceState.DRAINING):
        return False
    worker = session.get(Worker, inst.worker_id, with_for_update=True)
    if worker is None or worker.state == WorkerState.GONE:
        return False
    source = f"{inst.provider} {detail}".strip() if detail else inst.provider
    if kind != REBALANCE:
        if worker.drain_reason == SPOT:
            return False
        at = f", deadline {deadline.isoformat()}" if deadline is not None else ""
        spot_notice(
            session, worker, now=now, deadline=deadline, reason=f"{NOTICE_PREFIX} from the provider: {source}{at}"
        )
        return True
    if worker.state == WorkerState.DRAINING:
        return False  # already leaving; a rebalance changes nothing
    after = REBALANCE_NO_DEADLINE_S if rebalance_deadline_s is None else rebalance_deadline_s
    drain(session, worker.id, now=now, deadline_s=after, reason=REBALANCE)
    running = (
        "running tasks go on undisturbed"
        if rebalance_deadline_s is None
        else f"running tasks are interrupted after {rebalance_deadline_s:g}s"
    )
    why = f"rebalance recommendation from {source}: no new tasks, {running}; queued work gets a replacement"
    if inst.state == InstanceState.READY:
        transition(session, inst, InstanceState.DRAINING, reason=why, now=now)
    return True


def _reclaimed(session: Session, worker: Worker, *, now: datetime) -> None:
    """A worker drained for a spot notice is gone: its machine was reclaimed, not lost."""
    inst = _instance_of(session, worker)
    if inst is None:
        return
    notice = session.scalar(
        select(InstanceEvent.reason)
        .where(InstanceEvent.instance_id == inst.id, InstanceEvent.reason.startswith(NOTICE_PREFIX))
        .order_by(InstanceEvent.id.desc())
        .limit(1)
    )
    why = f"reclaimed after its {notice}" if notice else "reclaimed after a spot notice"
    transition(session, inst, InstanceState.PREEMPTED, reason=why, now=now)


def _go(session: Session, worker: Worker, *, now: datetime, reason: str, lost: bool = False) -> list[Task]:
    tasks = interrupt_worker_tasks(session, worker.id, now=now, reason=reason, lost=lost)
    move_worker(worker, WorkerState.GONE)
    worker.gone_at = now
    worker.gone_reason = reason
    note(
        session,
        "worker %s (%s, pool %s) gone: %s%s",
        worker.id,
        worker.hostname,
        worker.pool,
        reason,
        f"; {len(tasks)} task(s) interrupted" if tasks else "",
        worker_id=worker.id,
        pool=worker.pool,
    )
    if worker.drain_reason == SPOT and reason != "re-registered":
        _reclaimed(session, worker, now=now)
    return tasks


def deregister(session: Session, worker_id: str, *, now: datetime, reason: str = "deregistered") -> Worker:
    worker = get_worker(session, worker_id, lock=True)
    if worker.state != WorkerState.GONE:
        _go(session, worker, now=now, reason=reason)
    # A lost worker keeps its token so that, if it comes back, its heartbeat can be
    # told to shut down; a deregistered one has nothing left to say.
    for tok in session.scalars(select(ApiToken).where(ApiToken.worker_id == worker.id, ApiToken.kind == "worker")):
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


# ---- a gang launch's join token: k machines, each once -----------------------------


def check_gang_binding(session: Session, join: ApiToken, reg: Registration) -> Instance | None:
    """The checks of `check_join_binding` for a gang launch's token: the claimed
    instance must be one of that launch's. Once the provider reported an instance for
    every row of the launch, any other id is refused; before that a claim is taken on
    trust and checked when the ids arrive (`expel_impostors`). Returns the row of the
    claimed instance when it is known."""
    _check_pool_and_provider(join, reg)
    refused = "registration_refused"
    rows = gang_rows(session, join.request_id) if join.request_id else []
    if not rows or rows[0].pool != reg.pool:
        raise _refuse(
            reg,
            join,
            refused,
            "this join token's launch is unknown or in another pool; ask for a new one",
            f"gang launch {join.request_id} not found in pool {reg.pool}",
        )
    if all(r.state in _ENDED_INSTANCE_STATES for r in rows):
        raise _refuse(
            reg,
            join,
            refused,
            f"the gang launch this join token was made for is {rows[0].state}",
            f"gang launch {join.request_id} is {rows[0].state}",
        )
    recorded = {r.provider_instance_id: r for r in rows if r.provider_instance_id}
    launch = recorded.get(reg.instance_id)
    if launch is None and len(recorded) == len(rows):
        raise _refuse(
            reg,
            join,
            refused,
            "this join token was made for the machines of another launch; the claimed instance id is not one of them",
            f"claimed instance {reg.instance_id}, gang launch {join.request_id} is {', '.join(sorted(recorded))}",
        )
    other = session.scalar(
        select(Instance)
        .where(
            Instance.provider_instance_id == reg.instance_id,
            (Instance.launch_request_id != join.request_id) | Instance.launch_request_id.is_(None),
        )
        .limit(1)
    )
    if other is not None:
        raise _refuse(
            reg,
            join,
            refused,
            "the claimed instance id belongs to another launch; registration refused",
            f"claimed instance {reg.instance_id} of pool {other.pool} (launch {other.request_id})",
        )
    return launch


def _register_with_gang_token(
    session: Session, join: ApiToken, reg: Registration, *, now: datetime
) -> tuple[Worker, str]:
    """`register` for a gang launch's token (one user-data for its k machines): it
    registers up to `max_uses` machines, each a distinct instance of the launch, once.

    A slot is taken by a conditional UPDATE (`uses < max_uses`: of two concurrent
    registrations for the last slot one matches no row) and the instance is recorded
    under a unique (token, instance) key: the same instance presenting it again is a
    replay, except the agent process that used it retrying with its retry key."""
    key_hash = _digest(reg.retry_key) if reg.retry_key else None
    used = session.scalar(select(JoinUse).where(JoinUse.token_id == join.id, JoinUse.instance_id == reg.instance_id))
    if used is not None and not (
        key_hash is not None and used.retry_key_hash is not None and hmac.compare_digest(used.retry_key_hash, key_hash)
    ):
        raise _gang_replay(reg, join)
    launch = check_gang_binding(session, join, reg)
    retry_of: str | None = None
    if used is None:
        taken = session.execute(
            update(ApiToken)
            .where(ApiToken.id == join.id, ApiToken.uses < ApiToken.max_uses, ApiToken.revoked.is_(False))
            .values(uses=ApiToken.uses + 1, used_at=func.coalesce(ApiToken.used_at, now))
            .execution_options(synchronize_session=False)
        )
        session.refresh(join)
        if taken.rowcount != 1:  # type: ignore[attr-defined]
            raise _refuse(
                reg,
                join,
                "join_replay",
                f"this join token has registered all {join.max_uses} machines of its gang launch; "
                "a join token registers each machine of its launch once",
                f"gang join token (for {join.max_uses} machines) presented by one more, claiming {reg.instance_id}",
            )
        try:
            with session.begin_nested():
                used = JoinUse(token_id=join.id, instance_id=reg.instance_id, retry_key_hash=key_hash, used_at=now)
                session.add(used)
                session.flush()
        except IntegrityError:
            # The same instance registered concurrently and won: this one is the replay.
            raise _gang_replay(reg, join) from None
    else:
        retry_of = used.worker_id
    worker, plaintext = _take_instance(session, join, reg, retry_of, launch, now=now, what="gang join token")
    used.worker_id = worker.id
    return worker, plaintext


def _gang_replay(reg: Registration, join: ApiToken) -> Forbidden:
    return _refuse(
        reg,
        join,
        "join_replay",
        "this join token was already used by this machine; a join token registers each machine of its launch once "
        "(a restarted agent re-registers with its worker token)",
        f"gang join token presented again by {reg.instance_id}",
    )


def _expel_gang_impostors(session: Session, launch: Instance, *, now: datetime) -> list[str]:
    """Once the provider reported an instance for every row of a gang launch: workers
    that registered with its token claiming another instance id are expelled."""
    assert launch.launch_request_id is not None
    rows = gang_rows(session, launch.launch_request_id)
    if any(r.provider_instance_id is None for r in rows):
        return []  # not every id is known yet: checked again when the last one is
    ids = {r.provider_instance_id for r in rows if r.provider_instance_id}
    expelled: list[str] = []
    for join, use in session.execute(
        select(ApiToken, JoinUse)
        .join(JoinUse, JoinUse.token_id == ApiToken.id)
        .where(ApiToken.kind == "join", ApiToken.request_id == launch.launch_request_id, ApiToken.max_uses > 1)
    ):
        if use.instance_id in ids or not use.worker_id:
            continue
        worker = session.get(Worker, use.worker_id)
        if worker is None or worker.state not in LIVE_STATES:
            continue
        deregister(session, worker.id, now=now, reason="impostor")
        security.record(
            session,
            SecurityNote(
                kind=security.LAUNCH_MISMATCH,
                detail=(
                    f"worker {worker.id} registered as {use.instance_id} with the join token of gang launch "
                    f"{launch.launch_request_id}, whose instances the provider reports as {', '.join(sorted(ids))}; "
                    "deregistered"
                ),
                token_id=join.id,
                token_kind="join",
                pool=launch.pool,
                instance_id=use.instance_id,
                worker_id=worker.id,
            ),
            now=now,
        )
        expelled.append(worker.id)
    return expelled
