"""Task operations: enqueue, lease, start, finish, cancel and requeue.

Leasing is atomic. On PostgreSQL, candidate rows are locked with
`FOR UPDATE SKIP LOCKED`, so concurrent leasers never see the same task; on SQLite
every transaction is `BEGIN IMMEDIATE` (see `state.db`), so leasers take turns.
Lease order: queue priority, task priority, fair share between teams (the team
holding the fewest GPUs per unit of weight first), then age.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, func, not_, or_, select, true
from sqlalchemy.orm import Session

from autoscaler.admission import right_size
from autoscaler.admission import store as admission_store
from autoscaler.admission.fit import Need, Room, gpu_type_matches
from autoscaler.admission.gate import Machine, added_spend, gang_limits, largest_admissible
from autoscaler.admission.model import DEFAULT_TEAM, AdmissionTable, TeamAdmission, launched_for
from autoscaler.admission.quota import over_borrowed
from autoscaler.admission.quota import room as quota_room
from autoscaler.admission.shapes import Catalog
from autoscaler.auth.sealing import SecretKeys
from autoscaler.errors import Conflict, Forbidden, InvalidInput, NotFound
from autoscaler.lifecycle import RANK_ACTIVE, RANK_HOLDING, WORKER_LEASABLE, RankState, WorkerState
from autoscaler.planner.runtime_estimate import RuntimePrior
from autoscaler.queueing import gangs, runtime_history
from autoscaler.queueing.queues import known_queue
from autoscaler.queueing.states import ACTIVE, FINAL, TaskState, move_rank, move_worker, transition
from autoscaler.state.lifecycle_log import note
from autoscaler.state.models import (
    Instance,
    QueueRow,
    Snapshot,
    Task,
    TaskEvent,
    TaskLog,
    TaskRank,
    Worker,
    new_id,
)

LEASE_TTL = timedelta(seconds=90)
_ACTIVE = tuple(s.value for s in ACTIVE)
# Machine-caused ends (spot reclaims, drains, lost heartbeats, expired leases) a task
# may go through before it fails for good: a guard against a loop, not a policy (a
# task that checkpoints may need hundreds to finish on spot; the team's budget bounds
# what they cost). They never spend max_attempts.
MAX_INTERRUPTIONS = 1000
# Bounds of max_attempts (failed attempts allowed) and of retry_on_exit_codes.
MAX_ATTEMPTS = 100
MAX_RETRY_CODES = 64
MAX_COMMAND_ARGS = 4096
MAX_LOG_CHUNK = 256 * 1024


@dataclass(frozen=True)
class TaskSpec:
    queue: str
    command: list[str]
    gpus: int = 0  # per node
    # Machines it runs on at once (a gang, see queueing.gangs); 1: a single-node task.
    nodes: int = 1
    gpu_type: str | None = None
    cpus: float = 0
    memory_mb: int = 0
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    priority: int = 0
    # Failed attempts (non-zero exit, timeout) allowed: the first plus max_attempts - 1
    # retries. Interruptions by the machine never count.
    max_attempts: int = 3
    timeout_s: float | None = None
    # Only these exit codes are retried (129-255 also match a death by signal N-128);
    # None: every non-zero exit and every timeout is.
    retry_on_exit_codes: Sequence[int] | None = None
    # Sealed at rest, shown as `***`, opened only for the leasing worker. Kept out of
    # repr so a spec in a log line or traceback does not carry the values.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    # Run in this OCI image (autoscaler.agent.container); the pull secret names a
    # secret_env entry holding the registry login.
    image: str | None = None
    image_pull_secret: str | None = None
    # What the task carries (autoscaler.artifacts): code, a setup command, outputs and
    # a checkpoint dir (paths inside the task's directory).
    code: Mapping[str, object] | None = None
    setup: str | None = None
    outputs: Sequence[str] = ()
    checkpoint_dir: str | None = None
    checkpoint_every_s: int | None = None
    # What it survives (none | on-signal | every:MIN; None: none, or on-signal with a
    # checkpoint_dir) and how long it runs (None: estimated from earlier runs).
    checkpoints: str | None = None
    expected_runtime_s: float | None = None


def validate_task_path(what: str, path: str) -> str:
    """A path inside the task's directory: relative, without `..`; normalized."""
    if "\x00" in path or path.startswith("/") or ".." in path.split("/") or os.path.normpath(path) in ("", "."):
        raise InvalidInput(f"{what} {path!r} must be a path inside the task's directory (relative, no '..')")
    return os.path.normpath(path)


def validate_working_dir(path: str | None) -> str | None:
    """Refuse path tricks: a working dir must be absolute and free of `..` segments."""
    if path is None or path == "":
        return None
    if "\x00" in path or not path.startswith("/") or ".." in path.split("/"):
        raise InvalidInput(f"working_dir {path!r} must be an absolute path without '..' segments")
    return os.path.normpath(path)


# An image reference as engines accept it: [host[:port]/]path[:tag][@digest]. No
# spaces, no leading '-' (it would read as an engine flag).
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$")


def validate_image(image: str | None, pull_secret: str | None, secret_env: Mapping[str, str]) -> str | None:
    """The image as given, or None; refuses what no engine could pull and a pull
    secret that names nothing (it must be one of the task's secret_env names)."""
    if image is None or image == "":
        if pull_secret:
            raise InvalidInput("image_pull_secret is set but image is not: give --image too, or drop the secret")
        return None
    if len(image) > 512 or not _IMAGE.match(image):
        raise InvalidInput(
            f"image {image!r} is not an image reference like registry.example/team/train:1.2 "
            "(letters, digits and . _ / : @ + - only)"
        )
    if pull_secret and pull_secret not in secret_env:
        raise InvalidInput(
            f"image_pull_secret {pull_secret!r} is not one of the task's secret_env names: "
            f"pass the registry login as --secret-env {pull_secret}=USER:PASSWORD"
        )
    return image


def validate_retry_codes(codes: Sequence[int] | None) -> list[int] | None:
    """Sorted, without duplicates; each an exit status 1-255 (a death by signal N is
    given as 128+N, as shells report it: 137 for SIGKILL)."""
    if codes is None:
        return None
    if len(codes) > MAX_RETRY_CODES:
        raise InvalidInput(f"retry_on_exit_codes has {len(codes)} codes; at most {MAX_RETRY_CODES} are accepted")
    bad = [c for c in codes if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 255]
    if bad:
        raise InvalidInput(
            f"retry_on_exit_codes: {bad[0]!r} is not an exit code 1-255 "
            "(a process killed by signal N counts as 128+N, e.g. 137 for SIGKILL)"
        )
    return sorted(set(codes))


def exit_code_listed(exit_code: int | None, codes: Sequence[int]) -> bool:
    """Does an attempt's exit code match the list? The agent reports a death by signal
    N as -N; a shell in between reports it as 128+N: both match a listed 128+N."""
    if exit_code is None:
        return False
    return exit_code in codes or (exit_code < 0 and 128 - exit_code in codes)


def enqueue(
    session: Session,
    spec: TaskSpec,
    *,
    team: str,
    now: datetime,
    shapes: Catalog | None = None,
    secret_keys: SecretKeys | None = None,
    runtime_prior: RuntimePrior | None = None,
) -> Task:
    """Queue a task. With `shapes` (the config's catalog; the API passes it), a task
    that no pool of its queue could ever run is refused with the largest shape there.
    A spec with `secret_env` needs `secret_keys` (the values are sealed before the row
    is written, so no plaintext ever reaches the database)."""
    queue = known_queue(session, spec.queue, team=team)
    if queue.teams and team not in queue.teams:
        raise Forbidden(f"team {team!r} may not enqueue to queue {spec.queue!r} (allowed: {', '.join(queue.teams)})")
    if not spec.command:
        raise InvalidInput("command is empty: give the program and its arguments after `--`")
    if len(spec.command) > MAX_COMMAND_ARGS:
        raise InvalidInput(f"command has {len(spec.command)} arguments; at most {MAX_COMMAND_ARGS} are accepted")
    if not 1 <= spec.max_attempts <= MAX_ATTEMPTS:
        raise InvalidInput(
            f"max_attempts must be 1-{MAX_ATTEMPTS} (failed attempts allowed, the first one included), "
            f"not {spec.max_attempts}"
        )
    retry_codes = validate_retry_codes(spec.retry_on_exit_codes)
    if isinstance(spec.nodes, bool) or not 1 <= spec.nodes <= gangs.MAX_NODES:
        raise InvalidInput(f"nodes must be 1-{gangs.MAX_NODES} (machines the task runs on at once), not {spec.nodes}")
    if shapes is not None:
        need = Need(gpus=spec.gpus, gpu_type=spec.gpu_type, cpus=spec.cpus, memory_mb=spec.memory_mb)
        refused = shapes.gang_refusal(queue.name, queue.pools or [], need, spec.nodes)
        if refused:
            raise InvalidInput(refused)
    both = sorted(set(spec.env) & set(spec.secret_env))
    if both:
        raise InvalidInput(f"{', '.join(both)} given both in env and in secret_env; give each name once")
    if spec.secret_env and secret_keys is None:
        raise Conflict("this server has no secret key, so it cannot keep secret_env: see server.secret_key_file")
    code = _validate_code(session, spec.code, team)
    outputs = [validate_task_path("output", p) for p in spec.outputs]
    checkpoint_dir = validate_task_path("checkpoint_dir", spec.checkpoint_dir) if spec.checkpoint_dir else None
    if spec.checkpoint_every_s is not None and checkpoint_dir is None:
        raise InvalidInput("checkpoint_every_s needs a checkpoint_dir (--checkpoint-dir) to upload")
    if (code or spec.setup or outputs or checkpoint_dir) and spec.working_dir:
        raise InvalidInput(
            "code, setup, outputs and checkpoint_dir work in the task's own directory; drop working_dir to use them"
        )
    runtime = runtime_history.settle(
        session,
        team=team,
        queue=spec.queue,
        command=spec.command,
        checkpoints=spec.checkpoints,
        checkpoint_dir=checkpoint_dir,
        expected_runtime_s=spec.expected_runtime_s,
        prior=runtime_prior or RuntimePrior(),
    )
    task_id = new_id()
    task = Task(
        id=task_id,
        queue=spec.queue,
        team=team,
        command=list(spec.command),
        env=dict(spec.env),
        secret_env=secret_keys.seal_all(task_id, spec.secret_env) if secret_keys and spec.secret_env else {},
        working_dir=validate_working_dir(spec.working_dir),
        image=validate_image(spec.image, spec.image_pull_secret, spec.secret_env),
        image_pull_secret=spec.image_pull_secret,
        gpus=spec.gpus,
        nodes=spec.nodes,
        gpu_type=spec.gpu_type,
        cpus=spec.cpus,
        memory_mb=spec.memory_mb,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        retry_on_exit_codes=retry_codes,
        timeout_s=spec.timeout_s,
        code=code,
        setup=spec.setup,
        outputs=outputs or None,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every_s=spec.checkpoint_every_s,
        checkpoints=runtime.checkpoints,
        expected_runtime_s=runtime.expected_runtime_s,
        command_key=runtime.command_key,
        runtime_estimate=runtime.estimate.as_dict(),
        runtime_class_s=runtime.runtime_class_s,
        state=TaskState.QUEUED.value,
        sort_key=now,
        created_at=now,
        updated_at=now,
    )
    session.add(task)
    session.flush()
    session.add(TaskEvent(task_id=task.id, at=now, from_state=None, to_state="queued", reason="enqueued"))
    return task


def _validate_code(session: Session, code: Mapping[str, object] | None, team: str) -> dict[str, object] | None:
    """The code as stored; a snapshot must be one this team uploaded."""
    if not code:
        return None
    for field_name in ("snapshot", "diff_snapshot"):
        digest = code.get(field_name)
        if digest and session.get(Snapshot, (team, str(digest))) is None:
            raise NotFound(
                f"code {field_name} {digest} was not uploaded by team {team}: upload it with "
                "POST /api/v1/snapshots (the CLI's --code does)"
            )
    if code.get("snapshot"):
        return {"snapshot": code["snapshot"]}
    return {"git": code.get("git"), "ref": code.get("ref"), "diff_snapshot": code.get("diff_snapshot")}


def _busy_indices(session: Session, worker_id: str) -> tuple[set[int], list[Task]]:
    active = list(
        session.scalars(select(Task).where(Task.worker_id == worker_id, Task.state.in_([s.value for s in ACTIVE])))
    )
    used = {int(i) for t in active for i in (t.gpu_indices or [])}
    # A gang's ranks hold GPUs from their reservation on, also while being stopped.
    ranks = gangs.holding_on(session, worker_id)
    used |= {int(i) for r in ranks for i in (r.gpu_indices or [])}
    for task_id in sorted({r.task_id for r in ranks}):
        gang = session.get(Task, task_id)
        if gang is not None:
            active.append(gang)
    return used, active


def team_usage(session: Session) -> dict[str, tuple[int, int]]:
    """GPUs and tasks each team holds now (GPUs first: the dominant resource here)."""
    # A gang counts all its ranks' GPUs, from its first reservation on.
    reserving = select(TaskRank.task_id).where(TaskRank.state == RankState.RESERVED.value)
    rows = session.execute(
        select(Task.team, func.sum(Task.gpus * Task.nodes), func.count())
        .where(or_(Task.state.in_([s.value for s in ACTIVE]), Task.id.in_(reserving)))
        .group_by(Task.team)
    )
    return {team: (int(gpus or 0), int(n)) for team, gpus, n in rows}


def lease(
    session: Session, worker_id: str, *, now: datetime, gang_settings: gangs.GangSettings | None = None
) -> Task | None:
    """Give the worker the best queued task that fits it and that admission allows, or None.

    "Fits" is every resource: free GPUs, GPU type, free CPUs and free memory. "Allows"
    is the last policy evaluation's admission (`autoscaler.admission`): the team is
    not drained, may use this pool and capacity type, stays within its GPU quota, and
    whatever the lease adds to its spend fits its headroom. Both are conditions of the
    query, not a filter over a window of candidates, so no number of older tasks that
    do not fit can hide one that does. Order: the team's priority tier, queue
    priority, task priority, weighted fair share between teams (fewest GPUs held per
    unit of weight first), then age.

    A multi-node task (a gang) is leased one rank at a time (`queueing.gangs`): this
    returns None while its reservation is partial, the task when this lease completed
    it, and, on the next lease of every other rank's worker, the task again (its start).
    Gangs that already hold ranks are served before anything else.
    """
    settings = gang_settings or gangs.GangSettings()
    # Idle agents poll every few seconds, and most polls find nothing: answer those
    # with one indexed probe (ix_tasks_lease leads with state) instead of a row lock
    # and several queries. Skipping is safe: a task queued just after the probe is
    # seen by the next poll, exactly as if it had been queued just after a full lease.
    # (The poll then does not refresh last_heartbeat; heartbeats do that.)
    # The same probe asks whether a gang's start waits for this worker, and whether a
    # partial reservation has outlived its timeout (ix_task_ranks_state: there are only
    # as many reserved ranks as gangs forming), so the release below costs a lease
    # nothing until one has: leases are the hot path, a stale reservation is rare.
    stale_before = now - timedelta(seconds=settings.reservation_timeout_s)
    queued, starts, stale = session.execute(
        select(
            exists().where(Task.state == TaskState.QUEUED.value),
            exists().where(
                TaskRank.worker_id == worker_id,
                TaskRank.state == RankState.LEASED.value,
                TaskRank.delivered_at.is_(None),
            ),
            exists().where(TaskRank.state == RankState.RESERVED.value, TaskRank.reserved_at < stale_before),
        )
    ).one()
    if not queued and not starts:
        return None  # a stale reservation's gang is queued: none can be stale here
    if stale:
        release_stale_reservations(session, now=now, timeout_s=settings.reservation_timeout_s)
    pending = gangs.pending_start(session, worker_id) if starts else None
    # Touch the worker first: on PostgreSQL this row lock serialises two leases by the
    # same worker (so GPU indices are never handed out twice); a draining or gone
    # worker matches nothing and gets nothing.
    worker = session.scalar(select(Worker).where(Worker.id == worker_id).with_for_update())
    if worker is None:
        raise NotFound(f"worker {worker_id} is not registered")
    worker.last_heartbeat = now
    if pending is not None:
        pending.delivered_at = now
        return session.get(Task, pending.task_id)
    if worker.state not in WORKER_LEASABLE:
        return None
    queues = {q.name: q.priority for q in session.scalars(select(QueueRow)) if worker.pool in (q.pools or [])}
    if not queues:
        return None
    used, active = _busy_indices(session, worker_id)
    free = [i for i in range(worker.gpu_count) if i not in used]
    room = Room(
        len(free),
        worker.gpu_type,
        max(worker.cpus - sum(t.cpus for t in active), 0.0) if worker.cpus > 0 else None,
        max(worker.memory_mb - sum(t.memory_mb for t in active), 0) if worker.memory_mb > 0 else None,
    )
    machine = machine_of(session, worker, active)
    table = admission_store.load(session)
    usage = team_usage(session)
    whole = worker.gpu_count > 0 and not used
    choice = _choose(session, queues, room, machine, table, usage, worker_id=worker_id, whole=whole)
    if choice is None:
        return None
    task, adm = choice
    if gangs.is_gang(task):
        return _reserve_rank(session, task, adm, worker, machine, free, table, usage, now=now)
    if adm is not None and not admission_store.spend_headroom(
        session, adm, added_spend(adm, machine, task.gpus), now=now
    ):
        return None  # a concurrent lease spent the headroom first; the next poll looks again
    _start_attempt(session, task, worker.id, free[: task.gpus], detail=f"worker {worker.hostname}", now=now)
    _occupy(session, worker, task, task.gpus, adm, table, usage, now=now)
    return task


def _reserve_rank(
    session: Session,
    task: Task,
    adm: TeamAdmission | None,
    worker: Worker,
    machine: Machine,
    free: Sequence[int],
    table: AdmissionTable | None,
    usage: Mapping[str, tuple[int, int]],
    *,
    now: datetime,
) -> Task | None:
    """Hold one rank of the gang on this worker; the task when that completed it."""
    taken = gangs.current(session, task)
    # The whole gang's spend is taken at its first reservation (each rank priced as
    # this machine): admitted whole, or not at all.
    whole = added_spend(adm, machine, task.gpus) * task.nodes if adm is not None else 0.0
    if not taken and adm is not None and not admission_store.spend_headroom(session, adm, whole, now=now):
        return None
    rank = gangs.reserve(session, task, worker, free[: task.gpus], now=now)
    # The quota is taken for the whole gang at its first rank, as the spend was.
    _occupy(session, worker, task, task.gpus * task.nodes, None if taken else adm, table, usage, now=now)
    ranks = [*taken, rank]
    if len(ranks) < task.nodes:
        return None
    workers = ", ".join(r.worker_id for r in ranks)
    # A gang's workers and GPU indices are its ranks'.
    _start_attempt(session, task, None, [], detail=f"{task.nodes} ranks: {workers}", now=now)
    gangs.complete(session, ranks, now=now)
    rank.delivered_at = now
    return task


def _occupy(
    session: Session,
    worker: Worker,
    task: Task,
    gpus: int,
    adm: TeamAdmission | None,
    table: AdmissionTable | None,
    usage: Mapping[str, tuple[int, int]],
    *,
    now: datetime,
) -> None:
    """The worker is busy with `task`; with `adm` (the lease that admits the task),
    the team's GPUs held grow by `gpus` and any team now over its quota's borrowing
    gives GPUs back (`reclaim_borrowed`). Shared by a single task and a gang's rank."""
    move_worker(worker, WorkerState.BUSY)
    worker.idle_since = None
    if adm is not None and adm.quota is not None and table is not None:
        held = {t: g for t, (g, _n) in usage.items()}
        held[task.team] = held.get(task.team, 0) + gpus
        reclaim_borrowed(session, table, held, now=now)


def _start_attempt(
    session: Session, task: Task, worker_id: str | None, gpu_indices: list[int], *, detail: str, now: datetime
) -> None:
    """Open the task's next attempt: leased, its last end cleared, with `LEASE_TTL` for
    the agent to report it started. The one bookkeeping of a single task's lease and a
    gang's completed reservation (`worker_id` None: a gang's workers are its ranks')."""
    task.attempts += 1
    task.worker_id = worker_id
    task.gpu_indices = gpu_indices
    task.lease_deadline = now + LEASE_TTL
    task.exit_code = None
    task.end_reason = None
    transition(session, task, TaskState.LEASED, reason="leased", now=now, detail=detail)


def release_stale_reservations(session: Session, *, now: datetime, timeout_s: float) -> list[str]:
    """Partial gang reservations older than `timeout_s` are given up (their GPUs go
    back to everyone), so no two gangs wait on each other for ever. Returns the gangs.

    The gang goes behind the work already waiting: one that cannot complete (wider
    than the machines there are now) would otherwise, as the oldest, form again at
    once and keep every other gang from forming (one forms at a time, `_choose`)."""
    stale = gangs.stale_reservations(session, now=now, timeout_s=timeout_s)
    for task_id, ranks in stale.items():
        task = session.get(Task, task_id)
        for wid in gangs.release(session, ranks, now=now, reason=gangs.TIMED_OUT):
            _release_worker(session, wid, now)
        if task is not None:
            task.sort_key = now
            note(
                session,
                "task %s (team %s): partial reservation (%d of %d ranks) released after %.0f s",
                task.id,
                task.team,
                len(ranks),
                task.nodes,
                timeout_s,
                task_id=task.id,
                team=task.team,
            )
    return list(stale)


def machine_of(session: Session, worker: Worker, active: Sequence[Task] = ()) -> Machine:
    """The worker's machine as admission sees it: its price, capacity type, the team
    its unused time is charged to and, under `tenancy: team`, the one team it runs
    work for. A machine with no instance record (a declared on-prem machine, a Slurm
    node we do not price) costs nothing to use."""
    inst = session.scalar(
        select(Instance)
        .where(Instance.pool == worker.pool, Instance.provider_instance_id == worker.instance_id)
        .order_by(Instance.created_at.desc())
        .limit(1)
    )
    exclusive = worker.tenancy == "team"
    holders = {t.team for t in active}
    if inst is None:
        return Machine(worker.pool, worker.gpu_count, exclusive=exclusive, tenant=min(holders, default=None))
    # The ledger charges free GPUs to the launcher, or to `shared` under unused_cost: shared.
    charged = launched_for(inst.team) if worker.unused_cost != "shared" else None
    return Machine(
        worker.pool,
        inst.gpus or worker.gpu_count,
        inst.hourly_price,
        charged,
        inst.capacity_type,
        exclusive=exclusive,
        tenant=launched_for(inst.team) or min(holders, default=None),
        smaller=right_size.from_json(inst.smaller_machines),
    )


def _choose(
    session: Session,
    queues: Mapping[str, int],
    room: Room,
    machine: Machine,
    table: AdmissionTable | None,
    usage: Mapping[str, tuple[int, int]],
    *,
    worker_id: str = "",
    whole: bool = False,
) -> tuple[Task, TeamAdmission | None] | None:
    """The task to lease and its team's admission (None before any evaluation).
    `whole`: every GPU of the machine is free (`admission.right_size` applies)."""
    holding = tuple(s.value for s in RANK_HOLDING)
    held_here = select(TaskRank.task_id).where(TaskRank.worker_id == worker_id, TaskRank.state.in_(holding))
    reserving = gangs.reserving_ids(session)
    fit: list[ColumnElement[bool]] = [
        Task.state == TaskState.QUEUED.value,
        Task.queue.in_(list(queues)),
        Task.gpus <= room.gpus,
        # One rank of a gang per machine: its ranks are machines.
        or_(Task.nodes <= 1, Task.id.not_in(held_here)),
    ]
    if reserving and session.scalar(select(exists().where(Task.id.in_(reserving), Task.queue.in_(list(queues))))):
        # One gang forms at a time among the queues this machine serves: a second gang
        # may not start reserving until the first has all its ranks or timed out.
        # Two gangs each holding part of the machines they both need would otherwise
        # wait on each other until their timeouts, and could trade machines and wait
        # again for ever (found by tests/queueing/test_gang_property.py).
        fit.append(or_(Task.nodes <= 1, Task.id.in_(reserving)))
    if room.cpus is not None:
        fit.append(Task.cpus <= room.cpus + 1e-9)
    if room.memory_mb is not None:
        fit.append(Task.memory_mb <= room.memory_mb)
    if whole and machine.smaller:
        fit.append(_not_held_back(machine.smaller))
    wished = session.scalars(select(Task.gpu_type).where(*fit, Task.gpus > 0, Task.gpu_type.is_not(None)).distinct())
    mismatched = [g for g in wished if g and not gpu_type_matches(g, room.gpu_type)]
    if mismatched:
        fit.append(or_(Task.gpus == 0, Task.gpu_type.is_(None), Task.gpu_type.not_in(mismatched)))

    # Per tier, which teams may lease here and how many GPUs one task of each may take.
    tiers: dict[int, list[ColumnElement[bool]]] = defaultdict(list)
    adm_of: dict[str, TeamAdmission] = {}
    if table is None:
        tiers[0].append(true())
    else:
        held = {t: g for t, (g, _n) in usage.items()}
        quotas = table.quotas()
        Limits = tuple[int | None, tuple[int, int | None] | None]
        by_limit: dict[tuple[int, Limits], list[str]] = defaultdict(list)
        for team, adm in table.teams.items():
            if team == DEFAULT_TEAM:
                continue
            adm_of[team] = adm
            q = quota_room(team, quotas, held)
            limits = (largest_admissible(adm, machine, q), gang_limits(adm, machine, q))
            if limits != (None, None):
                by_limit[(adm.priority_tier, limits)].append(team)
        for (tier, limits), teams in by_limit.items():
            tiers[tier].append(and_(Task.team.in_(teams), _admissible(*limits, reserving)))
        default = table.of(DEFAULT_TEAM)
        limits = (largest_admissible(default, machine, None), gang_limits(default, machine, None))
        if limits != (None, None):
            known = [t for t in table.teams if t != DEFAULT_TEAM]
            cond = _admissible(*limits, reserving)
            tiers[default.priority_tier].append(and_(Task.team.not_in(known), cond) if known else cond)
    order = (QueueRow.priority.desc(), Task.priority.desc(), Task.sort_key, Task.id)
    postgres = session.get_bind().dialect.name == "postgresql"

    def admission_of(team: str) -> TeamAdmission | None:
        return adm_of.get(team) or (table.of(team) if table is not None else None)

    def share(team: str) -> tuple[float, float]:
        adm = admission_of(team)
        weight = max(adm.priority_weight if adm is not None else 1.0, 1e-9)
        gpus, count = usage.get(team, (0, 0))
        # CPU-only work holds no GPUs, so the task count breaks ties between teams.
        return (gpus / weight, count / weight)

    # Gangs holding part of a reservation go first, anywhere they fit: finishing one
    # frees its GPUs sooner than starting another would, and keeps a gang released
    # after its timeout from taking its workers straight back.
    passes: list[list[ColumnElement[bool]]] = [[Task.id.in_(reserving)]] if reserving else []
    passes.append([])
    for extra, tier in ((e, t) for e in passes for t in sorted(tiers, reverse=True)):
        where = [*fit, *extra, or_(*tiers[tier])]
        base = select(Task).join(QueueRow, QueueRow.name == Task.queue).where(*where)
        # On PostgreSQL a concurrent leaser may take the rows seen by one query before
        # the next runs (read committed): look again, a few times, before giving up.
        for _ in range(3):
            first = session.scalars(base.order_by(*order).limit(1)).first()
            if first is None:
                break
            level = (QueueRow.priority == queues[first.queue], Task.priority == first.priority)
            teams = list(
                session.scalars(
                    select(Task.team).join(QueueRow, QueueRow.name == Task.queue).where(*where, *level).distinct()
                )
            )
            if not teams:
                continue
            # Teams with equal shares go oldest task first, as a single queue would.
            best = min(share(t) for t in teams)
            tied = [t for t in teams if share(t) == best]
            stmt = base.where(*level, Task.team.in_(tied)).order_by(*order).limit(1)
            if postgres:
                stmt = stmt.with_for_update(skip_locked=True, of=Task)
            task = session.scalars(stmt).first()
            if task is not None:
                return task, admission_of(task.team)
    return None


def _not_held_back(smaller: Sequence[right_size.Size]) -> ColumnElement[bool]:
    """The query's form of `right_size.held_back`, negated: CPU-only work, or GPU work
    that none of the pool's smaller machines fits."""
    fits_one = [and_(Task.gpus <= s.gpus, Task.cpus <= s.cpus + 1e-9, Task.memory_mb <= s.memory_mb) for s in smaller]
    return or_(Task.gpus <= 0, not_(or_(*fits_one)))


def _admissible(
    single: int | None, gang: tuple[int, int | None] | None, reserving: Sequence[str]
) -> ColumnElement[bool]:
    """The query's admission condition for one team: a single-node task within
    `largest_admissible`, a gang within `gang_limits` (a gang already reserving was
    counted whole at its first rank)."""
    conds: list[ColumnElement[bool]] = []
    if single is not None:
        conds.append(and_(Task.nodes <= 1, Task.gpus <= single))
    if gang is not None:
        per_rank, total = gang
        parts: list[ColumnElement[bool]] = [Task.nodes > 1, Task.gpus <= per_rank]
        if total is not None:
            parts.append(or_(Task.gpus * Task.nodes <= total, Task.id.in_(list(reserving))))
        conds.append(and_(*parts))
    return or_(*conds) if conds else Task.id.is_(None)


def reclaim_borrowed(session: Session, table: AdmissionTable, held: Mapping[str, int], *, now: datetime) -> None:
    """A lender took its quota back: ask the borrowers' newest work to stop (SIGTERM,
    `interrupted:reclaim`, requeued at the head of its queue) until the cohort lends
    no more than its teams leave unused."""
    owed = over_borrowed(table.quotas(), held)
    for team, gpus in owed.items():
        pending = sum(
            t.gpus
            for t in session.scalars(
                select(Task).where(Task.team == team, Task.reclaim_requested.is_(True), Task.state.in_(_ACTIVE))
            )
        )
        need = gpus - pending
        if need <= 0:
            continue
        newest = session.scalars(
            select(Task)
            .where(Task.team == team, Task.state.in_(_ACTIVE), Task.gpus > 0, Task.reclaim_requested.is_(False))
            .order_by(Task.updated_at.desc(), Task.id.desc())
        )
        for victim in newest:
            if need <= 0:
                break
            victim.reclaim_requested = True
            victim.updated_at = now
            need -= victim.gpus


def _worker_task(session: Session, worker_id: str, task_id: str) -> Task:
    task = session.get(Task, task_id, with_for_update=True)
    if (
        task is not None
        and task.worker_id != worker_id
        and gangs.is_gang(task)
        and gangs.rank_of(session, task_id, worker_id) is not None
    ):
        return task
    if task is None or task.worker_id != worker_id:
        raise NotFound(f"task {task_id} is not leased by worker {worker_id}")
    return task


def mark_started(session: Session, worker_id: str, task_id: str, *, now: datetime) -> Task:
    task = _worker_task(session, worker_id, task_id)
    if gangs.is_gang(task):
        rank = gangs.rank_of(session, task_id, worker_id)
        if rank is None or rank.state != RankState.LEASED.value:
            return task  # being stopped, or a retried report
        move_rank(rank, RankState.RUNNING, now=now)
        rank.started_at = now
    if task.state == TaskState.LEASED.value:
        task.started_at = now
        transition(session, task, TaskState.RUNNING, reason="started", now=now)
    return task


def requeue_or_fail(session: Session, task: Task, *, now: datetime, reason: str) -> None:
    """After an attempt the machine ended: back to the head of the queue.

    Every caller is a machine-caused end: `interrupted:spot`, `interrupted:drain`,
    `interrupted:<deregistration>`, `lost:heartbeat`, `lost:lease_expired`. None of them
    is the task's failure, so none spends `max_attempts`; `interruptions` counts them,
    and only MAX_INTERRUPTIONS of them (a guard against a loop: a task that takes its
    machine down every time) fail the task. Failed attempts are `finish`'s business."""
    task.interruptions += 1
    task.worker_id = None
    task.gpu_indices = []
    task.lease_deadline = None
    if task.cancel_requested:
        # Canceled while in flight: the user's wish wins over a retry.
        transition(session, task, TaskState.CANCELED, reason="canceled", now=now)
        task.finished_at = now
        return
    if task.interruptions > MAX_INTERRUPTIONS:
        transition(
            session,
            task,
            TaskState.FAILED,
            reason="max_interruptions",
            now=now,
            detail=f"interrupted {task.interruptions} times; last: {reason}",
        )
        task.finished_at = now
        return
    # sort_key is kept: an interrupted task goes back to the head of its queue.
    transition(session, task, TaskState.QUEUED, reason=f"requeued after {reason}", now=now)


def retry_refusal(task: Task, reason: str, exit_code: int | None) -> str | None:
    """Why a failed attempt (already counted in `failures`) is not retried, or None.

    - `start_failed` never is: a program that cannot start (not found, not
      executable, working dir missing) will not start next time either;
    - with `retry_on_exit_codes`, only the listed exit codes are: other exits and
      timeouts fail at once;
    - otherwise every non-zero exit and every timeout is, until `failures` reaches
      `max_attempts`."""
    if reason == "start_failed":
        return "a program that cannot start is not retried"
    codes = task.retry_on_exit_codes
    if codes is not None:
        listed = ", ".join(str(c) for c in codes)
        if reason == "timeout":
            return f"not retried: a timeout is not one of retry_on_exit_codes [{listed}]"
        if not exit_code_listed(exit_code, codes):
            return f"not retried: exit code {exit_code} is not one of retry_on_exit_codes [{listed}]"
    if task.failures >= task.max_attempts:
        return f"max_attempts reached: failed attempts {task.failures} of {task.max_attempts}"
    return None


END_REASONS = ("exit", "canceled", "interrupted", "timeout", "start_failed")


def finish(
    session: Session,
    worker_id: str,
    task_id: str,
    *,
    now: datetime,
    reason: str,
    exit_code: int | None = None,
    detail: str = "",
) -> Task:
    """The agent reports how an attempt ended.

    reason: exit (with exit_code), canceled, interrupted (spot / drain; detail says
    which), timeout, start_failed. A non-zero exit, a timeout or a start failure is a
    failed attempt (`failures`); it goes back to the queue while `retry_refusal` allows.
    An interruption goes back through `requeue_or_fail` and spends nothing.
    """
    if reason not in END_REASONS:
        raise InvalidInput(f"unknown end reason {reason!r}; expected one of {', '.join(END_REASONS)}")
    task = _worker_task(session, worker_id, task_id)
    if gangs.is_gang(task):
        return _finish_rank(session, worker_id, task, now=now, reason=reason, exit_code=exit_code, detail=detail)
    if task.state not in {s.value for s in ACTIVE}:
        return task  # a retried report: the first one won
    _end_attempt(session, task, now=now, reason=reason, exit_code=exit_code, detail=detail)
    _release_worker(session, worker_id, now)
    return task


def _finish_rank(
    session: Session, worker_id: str, task: Task, *, now: datetime, reason: str, exit_code: int | None, detail: str
) -> Task:
    """One rank of a gang ended. The gang succeeds when every rank exited 0; any other
    end of any rank ends the gang's attempt: the other ranks are stopped and the task
    goes where a single task's attempt ending so would (retried, requeued, failed)."""
    rank = gangs.rank_of(session, task.id, worker_id)
    if rank is None:
        return task  # a retried report: the first one won
    was_stopping = rank.state == RankState.STOPPING.value
    move_rank(rank, RankState.EXITED, now=now)
    rank.exit_code = exit_code
    rank.end_reason = (reason if reason != "exit" else f"exit {exit_code}")[:64]
    gangs.close_rank_attempt(session, rank, now=now)
    if not was_stopping and task.state in {s.value for s in ACTIVE}:
        if reason == "exit" and exit_code == 0 and not task.cancel_requested:
            if not any(r.state in {s.value for s in RANK_ACTIVE} for r in gangs.current(session, task)):
                _end_attempt(session, task, now=now, reason=reason, exit_code=exit_code, detail=detail)
        else:
            gangs.stop_others(session, task, rank, now=now)
            why = f"rank {rank.rank} on worker {worker_id}: {rank.end_reason}"
            # An interruption's detail is its kind (`interrupted:<detail>` is the end
            # reason): the rank goes in the history's note instead.
            if reason == "interrupted":
                why = ""
            _end_attempt(
                session,
                task,
                now=now,
                reason=reason,
                exit_code=exit_code,
                detail=f"{why}; {detail}" if why and detail else (why or detail),
            )
    _release_worker(session, worker_id, now)
    return task


def _end_attempt(
    session: Session, task: Task, *, now: datetime, reason: str, exit_code: int | None, detail: str
) -> None:
    """Move an active task to where an attempt ending so takes it (the worker's side is
    the caller's)."""
    task.exit_code = exit_code
    if reason == "exit" and exit_code == 0:
        task.end_reason = "exit_code"
        transition(session, task, TaskState.SUCCEEDED, reason="exit 0", now=now)
    elif reason == "canceled" or (task.cancel_requested and reason != "interrupted"):
        task.end_reason = "canceled"
        transition(session, task, TaskState.CANCELED, reason="canceled", now=now, detail=detail)
    elif reason == "interrupted":
        task.end_reason = f"interrupted:{detail or 'unknown'}"
        transition(session, task, TaskState.INTERRUPTED, reason=task.end_reason, now=now, detail=detail)
        requeue_or_fail(session, task, now=now, reason=task.end_reason)
        return
    else:
        # The task's own failure: it spends one of max_attempts, and is retried unless
        # `retry_refusal` says why not.
        task.end_reason = "exit_code" if reason == "exit" else reason
        why = f"exit {exit_code}" if reason == "exit" else reason
        task.failures += 1
        refusal = retry_refusal(task, reason, exit_code)
        if refusal is None:
            # Behind the work already waiting (a new sort key), not at the head: a
            # crash-looping task cannot starve the rest of its queue.
            note = f"failed attempt {task.failures} of {task.max_attempts}: requeued behind waiting work"
            transition(
                session, task, TaskState.QUEUED, reason=why, now=now, detail=f"{note}; {detail}" if detail else note
            )
            task.sort_key = now
            task.worker_id = None
            task.gpu_indices = []
            task.lease_deadline = None
            return
        transition(
            session, task, TaskState.FAILED, reason=why, now=now, detail=f"{refusal}; {detail}" if detail else refusal
        )
    task.finished_at = now
    task.lease_deadline = None


def _release_worker(session: Session, worker_id: str, now: datetime) -> None:
    worker = session.get(Worker, worker_id)
    if worker is None or worker.state != WorkerState.BUSY:
        return
    # Idle once it holds no gang rank and runs no task (two probes, no rows loaded).
    if gangs.holding_on(session, worker_id):
        return
    running = exists().where(Task.worker_id == worker_id, Task.state.in_([s.value for s in ACTIVE]))
    if not session.scalar(select(running)):
        move_worker(worker, WorkerState.IDLE)
        worker.idle_since = now


def cancel(session: Session, task: Task, *, now: datetime) -> Task:
    """Queued: removed at once. Leased or running: the worker is told to stop it."""
    if task.state in {s.value for s in FINAL}:
        return task
    if task.state == TaskState.QUEUED.value:
        for wid in gangs.release(session, gangs.current(session, task), now=now, reason="canceled"):
            _release_worker(session, wid, now)
        task.end_reason = "canceled"
        task.finished_at = now
        transition(session, task, TaskState.CANCELED, reason="canceled by user", now=now)
    else:
        task.cancel_requested = True
        task.updated_at = now
    return task


def interrupt_worker_tasks(session: Session, worker_id: str, *, now: datetime, reason: str, lost: bool) -> list[Task]:
    """Every active task of a vanished or deregistered worker: lost/interrupted, then requeued."""
    tasks = list(
        session.scalars(
            select(Task).where(Task.worker_id == worker_id, Task.state.in_([s.value for s in ACTIVE])).with_for_update()
        )
    )
    for task in tasks:
        to = TaskState.LOST if lost else TaskState.INTERRUPTED
        task.end_reason = f"{to.value}:{reason}"
        transition(session, task, to, reason=task.end_reason, now=now)
        requeue_or_fail(session, task, now=now, reason=task.end_reason)
    # Its ranks of gangs: a reserved one is given up (the gang reserves another), one
    # of a running gang ends the whole gang's attempt, as a machine-caused end.
    for rank in gangs.holding_on(session, worker_id):
        gang = session.get(Task, rank.task_id, with_for_update=True)
        was_active = rank.state in {s.value for s in RANK_ACTIVE}
        gangs.release(session, [rank], now=now, reason=f"worker gone: {reason}")
        if gang is None or not was_active or gang.state not in {s.value for s in ACTIVE}:
            continue
        to = TaskState.LOST if lost else TaskState.INTERRUPTED
        gangs.stop_others(session, gang, rank, now=now)
        for wid in gangs.released_workers(session, gang):
            _release_worker(session, wid, now)
        gang.end_reason = f"{to.value}:{reason}"
        transition(session, gang, to, reason=gang.end_reason, now=now, detail=f"rank {rank.rank} on worker {worker_id}")
        requeue_or_fail(session, gang, now=now, reason=gang.end_reason)
        tasks.append(gang)
    return tasks


def append_logs(
    session: Session, worker_id: str, task_id: str, chunks: Sequence[tuple[str, str]], *, now: datetime
) -> int:
    task = session.get(Task, task_id)
    rank = gangs.rank_of(session, task_id, worker_id) if task is not None and gangs.is_gang(task) else None
    if task is None or (task.worker_id != worker_id and rank is None):
        raise NotFound(f"task {task_id} is not leased by worker {worker_id}")
    attempt, rank_no = (rank.attempt, rank.rank) if rank is not None else (task.attempts, 0)
    total = 0
    for stream, data in chunks:
        if stream not in ("stdout", "stderr"):
            raise InvalidInput(f"log stream must be stdout or stderr, not {stream!r}")
        total += len(data)
        if total > MAX_LOG_CHUNK:
            raise InvalidInput(f"log upload exceeds {MAX_LOG_CHUNK} bytes; send smaller chunks")
        session.add(TaskLog(task_id=task_id, attempt=attempt, rank=rank_no, stream=stream, data=data, at=now))
    return len(chunks)


def read_logs(
    session: Session, task_id: str, *, after: int = 0, limit: int = 1000, rank: int | None = None
) -> list[TaskLog]:
    """The task's log chunks after `after`; with `rank`, only that rank's (a gang's)."""
    stmt = select(TaskLog).where(TaskLog.task_id == task_id, TaskLog.id > after)
    if rank is not None:
        stmt = stmt.where(TaskLog.rank == rank)
    return list(session.scalars(stmt.order_by(TaskLog.id).limit(limit)))


def expire_leases(session: Session, *, now: datetime) -> list[Task]:
    """Leased tasks whose agent never confirmed the start before the deadline are lost."""
    tasks = list(
        session.scalars(
            select(Task).where(Task.state == TaskState.LEASED.value, Task.lease_deadline < now).with_for_update()
        )
    )
    # A gang some of whose ranks started while another's start never did (its lease
    # answer was lost: a crash after the N-th reservation committed, before the answer
    # reached that agent) is half started: past the lease deadline it is ended like a
    # lease that expired, so a gang starts whole or is released, never half.
    half = list(
        session.scalars(
            select(Task)
            .where(
                Task.state == TaskState.RUNNING.value,
                Task.nodes > 1,
                Task.lease_deadline < now,
                exists().where(TaskRank.task_id == Task.id, TaskRank.state == RankState.LEASED.value),
            )
            .with_for_update(of=Task)
        )
    )
    for task in [*tasks, *half]:
        worker_id = task.worker_id
        task.end_reason = "lost:lease_expired"
        if task in half:
            # Its unstarted ranks' starts were never confirmed long past the deadline:
            # released at once (an agent reporting that start this late is refused).
            gangs.release(session, gangs.unstarted(session, task), now=now, reason="start never confirmed")
        if gangs.is_gang(task):
            gangs.stop_others(session, task, None, now=now)
        transition(session, task, TaskState.LOST, reason="lease expired", now=now)
        requeue_or_fail(session, task, now=now, reason="lease expired")
        for wid in [worker_id] if worker_id else gangs.released_workers(session, task):
            _release_worker(session, wid, now)
    return [*tasks, *half]
