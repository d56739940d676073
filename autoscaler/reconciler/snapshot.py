"""Observe: one consistent view of demand, fleet and money, in a handful of aggregate
queries (never one per task or per instance), turned into the planner's input and the
policy's input.

Queued tasks are grouped by shape in SQL, so 10,000 pending tasks of a few shapes
cost a few rows; workers' load comes from one GROUP BY over active tasks.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from autoscaler.admission import right_size
from autoscaler.config import AutoscalerConfig
from autoscaler.ledger.period import month_bounds
from autoscaler.ledger.reclaims import offering_key
from autoscaler.ledger.spend import burn_rate, month_to_date, shared_pools
from autoscaler.lifecycle import (
    INSTANCE_LIVE,
    INSTANCE_OPEN,
    INSTANCE_RUNNING,
    RANK_HOLDING,
    TASK_ACTIVE,
    WORKER_LIVE,
    RankState,
)
from autoscaler.planner.capacity_choice import CapacityModel
from autoscaler.planner.model import (
    DemandGroup,
    InstanceView,
    OfferingView,
    PlanInput,
    PoolView,
    QueueView,
    WorkerView,
)
from autoscaler.planner.reclaim_rate import ReclaimEstimate
from autoscaler.planner.standby import STANDBY_MISS, Exposure, Shape, Standby
from autoscaler.planner.warm_pool import WINDOW_S, WarmPool
from autoscaler.policy.schema import Decision, PolicyInput, PoolInput, QueueInput, SpotOfferingInput, TeamInput
from autoscaler.state.models import (
    Instance,
    InstanceEvent,
    OfferingBlock,
    QueueRow,
    Task,
    TaskAttempt,
    TaskRank,
    Worker,
)

ACTIVE_TASK_STATES = TASK_ACTIVE
LIVE_WORKER_STATES = WORKER_LIVE
# Instances the cycle still has business with (everything but the final states).
OPEN_INSTANCE_STATES = INSTANCE_OPEN


@dataclass(frozen=True)
class Snapshot:
    now: datetime
    queues: tuple[QueueView, ...]
    pools: tuple[PoolView, ...]
    demand: tuple[DemandGroup, ...]
    workers: tuple[WorkerView, ...]
    instances: tuple[InstanceView, ...]
    running_gpus: Mapping[str, int]
    running_by_queue: Mapping[str, int]
    month_to_date: Mapping[str, float]
    burn: Mapping[str, float]
    pending_gpus: Mapping[str, int] = field(default_factory=dict)
    # Each spot offering's observed reclaim rate (ledger.reclaims), and the model the
    # planner weighs spot against on-demand with (None: the pool order alone).
    reclaim: Mapping[str, ReclaimEstimate] = field(default_factory=dict)
    capacity: CapacityModel | None = None
    # Recent task starts by machine kind: what the adaptive warm pool is sized by.
    warm: WarmPool | None = None
    # Running checkpointing work on spot: what standby machines are sized by (None: none).
    standby: Standby | None = None

    def plan_input(self, decision: Decision, *, drain_deadline_s: float = 300.0) -> PlanInput:
        return PlanInput(
            self.now,
            self.queues,
            self.pools,
            self.demand,
            self.workers,
            self.instances,
            decision,
            self.running_gpus,
            drain_deadline_s,
            self.capacity,
            self.warm,
            self.standby,
        )

    def summary(self) -> dict[str, object]:
        """The input summary kept on the decision record."""
        states = Counter(i.state for i in self.instances)
        return {
            "pending_tasks": sum(g.count for g in self.demand),
            "pending_gpus": sum(g.machines * g.gpus for g in self.demand),
            "workers": len(self.workers),
            "idle_workers": sum(1 for w in self.workers if w.state == "idle"),
            "instances": dict(states),
            "running_gpus": dict(self.running_gpus),
            "month_to_date_usd": {t: round(v, 2) for t, v in self.month_to_date.items()},
            "burn_usd_per_hour": {t: round(v, 2) for t, v in self.burn.items()},
        }


@dataclass(frozen=True)
class PoolState:
    """What the reconciler keeps per pool between cycles and hands to the snapshot."""

    offerings: tuple[OfferingView, ...] = ()
    backoff_until: datetime | None = None
    max_gang_nodes: int | None = None  # the driver's `Capabilities.max_gang_nodes`


def observe(
    session: Session, config: AutoscalerConfig, *, now: datetime, pool_state: Mapping[str, PoolState]
) -> Snapshot:
    demand = _demand(session)
    running_gpus: Counter[str] = Counter()
    running_by_queue: Counter[str] = Counter()
    for queue, team, n, gpus in session.execute(
        select(Task.queue, Task.team, func.count(), func.sum(Task.gpus * Task.nodes))
        .where(Task.state.in_(ACTIVE_TASK_STATES))
        .group_by(Task.queue, Task.team)
    ):
        running_gpus[team] += int(gpus or 0)
        running_by_queue[queue] += int(n)
    tenants: dict[str, set[str]] = defaultdict(set)
    for wid, team in session.execute(
        select(Task.worker_id, Task.team).where(Task.state.in_(ACTIVE_TASK_STATES)).distinct()
    ):
        if wid is not None:
            tenants[wid].add(team)
    load = {
        wid: (int(n), int(g or 0), float(c or 0.0), int(m or 0))
        for wid, n, g, c, m in session.execute(
            select(Task.worker_id, func.count(), func.sum(Task.gpus), func.sum(Task.cpus), func.sum(Task.memory_mb))
            .where(Task.state.in_(ACTIVE_TASK_STATES))
            .group_by(Task.worker_id)
        )
    }
    # Ranks of gangs hold their workers from the reservation on (also while being
    # stopped): such a worker is busy, never idle capacity nor a scale-down candidate.
    holding = [r.value for r in RANK_HOLDING]
    for wid, team, k, gs, cs, ms in session.execute(
        select(
            TaskRank.worker_id,
            Task.team,
            func.count(),
            func.sum(Task.gpus),
            func.sum(Task.cpus),
            func.sum(Task.memory_mb),
        )
        .join(Task, Task.id == TaskRank.task_id)
        .where(TaskRank.state.in_(holding))
        .group_by(TaskRank.worker_id, Task.team)
    ):
        n0, g0, c0, m0 = load.get(wid, (0, 0, 0.0, 0))
        load[wid] = (n0 + int(k), g0 + int(gs or 0), c0 + float(cs or 0.0), m0 + int(ms or 0))
        tenants[wid].add(team)
    # Plain column rows, not ORM objects: loading entities decoded every worker's JSON
    # columns (GPU list, metrics) and filled the identity map for nothing, which was
    # most of this function's time at 1,000 workers and grew faster than the fleet.
    instance_rows = session.execute(
        select(
            Instance.id,
            Instance.pool,
            Instance.state,
            Instance.gpus,
            Instance.gpu_type,
            Instance.instance_type,
            Instance.capacity_type,
            Instance.hourly_price,
            Instance.created_at,
            Instance.team,
            Instance.launched_at,
            Instance.worker_id,
            Instance.provider_instance_id,
            Instance.smaller_machines,
        ).where(Instance.state.in_(OPEN_INSTANCE_STATES))
    ).all()
    by_provider_id = {(i.pool, i.provider_instance_id): i.id for i in instance_rows if i.provider_instance_id}
    preempted_why = _preempted_reasons(session, [i.id for i in instance_rows if i.state == "preempted"])
    by_worker = {i.worker_id: i.id for i in instance_rows if i.worker_id}
    workers: list[WorkerView] = []
    worker_state: dict[str, str] = {}
    for w in session.execute(
        select(
            Worker.id,
            Worker.pool,
            Worker.state,
            Worker.gpu_count,
            Worker.gpu_type,
            Worker.idle_since,
            Worker.instance_id,
            Worker.cpus,
            Worker.memory_mb,
        ).where(Worker.state.in_(LIVE_WORKER_STATES))
    ):
        n, used, used_cpus, used_mem = load.get(w.id, (0, 0, 0.0, 0))
        inst_id = by_worker.get(w.id) or by_provider_id.get((w.pool, w.instance_id))
        worker_state[w.id] = w.state
        workers.append(
            WorkerView(
                w.id,
                w.pool,
                w.state,
                w.gpu_count,
                used,
                n,
                w.gpu_type,
                w.idle_since,
                inst_id,
                max(w.cpus - used_cpus, 0.0) if w.cpus else None,
                max(w.memory_mb - used_mem, 0) if w.memory_mb else None,
                next(iter(tenants[w.id])) if len(tenants.get(w.id, ())) == 1 else None,
            )
        )
    instances = tuple(
        InstanceView(
            i.id,
            i.pool,
            i.state,
            i.gpus,
            i.gpu_type,
            i.instance_type,
            i.capacity_type,
            i.hourly_price,
            i.created_at,
            i.team,
            i.launched_at,
            i.worker_id,
            (worker_state.get(i.worker_id, "gone") if i.worker_id else None),
            preempted_why.get(i.id, ""),
            right_size.from_json(i.smaller_machines),
        )
        for i in instance_rows
    )
    blocked: dict[str, set[str]] = defaultdict(set)
    for b in session.scalars(select(OfferingBlock).where(OfferingBlock.until > now)):
        if b.scope == "offering":
            blocked[b.pool].add(b.key)
        elif b.scope == "zone":
            blocked[b.pool].add(f"zone:{b.key}")
        else:
            # A region or provider scope blocks every pool of that provider (and region).
            for p in config.pools:
                if p.provider == b.provider and (b.scope == "provider" or p.region == b.key):
                    blocked[p.name].add("*")
    pools = tuple(
        PoolView(
            name=p.name,
            provider=p.provider,
            static=p.provider == "static",
            capacity_types=tuple(p.capacity_types),
            min_instances=p.min_instances,
            max_instances=p.max_instances,
            idle_timeout_s=p.idle_timeout_s,
            boot_timeout_s=p.boot_timeout_s,
            offerings=pool_state[p.name].offerings if p.name in pool_state else (),
            region=p.region,
            blocked=frozenset(blocked.get(p.name, ())),
            backoff_until=pool_state[p.name].backoff_until if p.name in pool_state else None,
            tenancy=p.tenancy,
            unused_cost=p.unused_cost,
            max_gang_nodes=pool_state[p.name].max_gang_nodes if p.name in pool_state else None,
            warm_pool=p.warm_pool,
        )
        for p in config.pools
    )
    queues = tuple(
        QueueView(q.name, tuple(q.pools or ()), q.priority)
        for q in session.scalars(select(QueueRow).order_by(QueueRow.name))
    )
    pending: Counter[str] = Counter()
    for g in demand:
        pending[g.team] += g.gpus * g.machines
    return Snapshot(
        now=now,
        queues=queues,
        pools=pools,
        demand=demand,
        workers=tuple(workers),
        instances=instances,
        running_gpus=dict(running_gpus),
        running_by_queue=dict(running_by_queue),
        month_to_date=month_to_date(session, now),
        burn=burn_rate(session, shared=shared_pools(config)),
        pending_gpus=dict(pending),
        # Only an adaptive pool reads the starts; without one the query is not made.
        warm=(
            WarmPool(recent_starts(session, now), config.capacity.boot_s)
            if any(p.warm_pool == "adaptive" for p in config.pools)
            else None
        ),
    )


def recent_starts(session: Session, now: datetime, window_s: float = WINDOW_S) -> dict[tuple[str, int], int]:
    """Task attempts started in the window, by the kind of machine they started on
    (pool, GPUs): the arrival rate the warm pool is sized by. One range read of the
    attempts' start index joined to their workers."""
    since = now - timedelta(seconds=window_s)
    return {
        (str(pool), int(gpus)): int(n)
        for pool, gpus, n in session.execute(
            select(Worker.pool, Worker.gpu_count, func.count())
            .select_from(TaskAttempt)
            .join(Worker, Worker.id == TaskAttempt.worker_id)
            .where(TaskAttempt.started_at >= since, TaskAttempt.started_at <= now)
            .group_by(Worker.pool, Worker.gpu_count)
        )
    }


def standby_exposure(session: Session, model: CapacityModel, now: datetime, *, shared: bool = False) -> Standby:
    """Running checkpointing tasks on live spot machines that need standby machines to
    keep their wait target (`CapacityModel.standby_miss_needed`: their expected run time
    left would pass it if every reclaim waited a boot), by
    shape, each counted at its machine's estimated reclaim rate (`model`): what standby
    machines are sized by (planner.standby). One GROUP BY over active tasks joined to
    their instances. `shared`: the planner pools the shapes across teams."""
    columns = (
        Task.team,
        Task.queue,
        Task.gpus,
        Task.gpu_type,
        Task.cpus,
        Task.memory_mb,
        Task.checkpoints,
        Task.runtime_class_s,
        Task.created_at,
        Task.interruptions,
        Instance.instance_type,
        Instance.zone,
    )
    rows = session.execute(
        select(*columns, func.count())
        .join(Instance, Instance.worker_id == Task.worker_id)
        .where(
            Task.state.in_(ACTIVE_TASK_STATES),
            Task.nodes < 2,
            Task.checkpoints.is_not(None),
            Task.checkpoints != "none",
            Instance.capacity_type == "spot",
            Instance.state.in_(INSTANCE_LIVE),
        )
        .group_by(*columns)
    )
    tasks: Counter[Shape] = Counter()
    rate: defaultdict[Shape, float] = defaultdict(float)
    longest: dict[Shape, float] = {}
    miss: dict[Shape, float] = {}
    for team, queue, gpus, gpu_type, cpus, mem, checkpoints, runtime_s, created, k, itype, zone, n in rows:
        key = offering_key("spot", str(itype), zone)
        runtime_h = float(runtime_s) / 3600.0 if runtime_s else model.default_runtime_h
        ran_h = max((now - created).total_seconds(), 0.0) / 3600.0
        # A task that has outlived its estimate is expected to run about as long again
        # as it has: the median remaining life of a heavy-tailed run time (the prior's
        # log-normal; a Pareto's exactly).
        left_h = runtime_h - ran_h if runtime_h > ran_h else ran_h
        need = model.standby_miss_needed(key, left_h, checkpoints, int(k or 0))
        if need is None:
            continue
        shape = Shape(str(team), str(queue), int(gpus or 0), gpu_type, float(cpus or 0.0), int(mem or 0))
        tasks[shape] += int(n)
        miss[shape] = min(miss.get(shape, 1.0), need)
        rate[shape] += int(n) * model.rate(key)
        longest[shape] = max(longest.get(shape, 0.0), left_h)
    exposure = {s: Exposure(n, rate[s], longest.get(s), miss[s]) for s, n in tasks.items()}
    return Standby(exposure, model.boot_h, model.standby_miss or STANDBY_MISS, shared)


def policy_input(snap: Snapshot, config: AutoscalerConfig) -> PolicyInput:
    """The versioned policy input (see `autoscaler.policy.schema`) for this snapshot."""
    start, end = month_bounds(snap.now)
    hours_left = max((end - snap.now).total_seconds(), 0.0) / 3600.0
    team_names = sorted(
        {t.name for t in config.teams} | set(snap.month_to_date) | set(snap.pending_gpus) | set(snap.running_gpus)
    )
    teams = [
        TeamInput(
            name=t,
            month_to_date_usd=max(snap.month_to_date.get(t, 0.0), 0.0),
            burn_rate_usd_per_hour=max(snap.burn.get(t, 0.0), 0.0),
            forecast_usd=max(snap.month_to_date.get(t, 0.0) + snap.burn.get(t, 0.0) * hours_left, 0.0),
            running_gpus=snap.running_gpus.get(t, 0),
            pending_gpus=snap.pending_gpus.get(t, 0),
        )
        for t in team_names
    ]
    by_queue: dict[str, list[DemandGroup]] = defaultdict(list)
    for g in snap.demand:
        by_queue[g.queue].append(g)
    queues = []
    for q in snap.queues:
        groups = by_queue.get(q.name, [])
        oldest = min((g.oldest for g in groups if g.oldest), default=None)
        shapes: Counter[str] = Counter()
        for g in groups:
            if g.gpus:
                shapes[f"{g.gpus}x{g.gpu_type or 'any'}"] += g.gpus * g.machines
        queues.append(
            QueueInput(
                name=q.name,
                pools=list(q.pools),
                priority=q.priority,
                depth=sum(g.count for g in groups),
                running=snap.running_by_queue.get(q.name, 0),
                oldest_wait_s=max((snap.now - oldest).total_seconds(), 0.0) if oldest else None,
                teams_waiting=sorted({g.team for g in groups}),
                pending_gpus_by_shape=dict(shapes),
            )
        )
    live = Counter(i.pool for i in snap.instances if i.state in INSTANCE_LIVE)
    pools = [
        PoolInput(
            name=p.name,
            provider=p.provider,
            region=p.region or "local",
            kind="static" if p.static else "cloud",
            capacity_types=list(p.capacity_types),
            min_instances=p.min_instances,
            max_instances=p.max_instances,
            current_instances=live.get(p.name, 0),
            hourly_prices={f"{o.instance_type}/{o.capacity_type}": o.hourly_price for o in p.offerings},
            spot_offerings=_spot_offerings(snap, p),
        )
        for p in snap.pools
    ]
    fleet = {
        "instances": sum(live.values()),
        "gpus": sum(i.gpus for i in snap.instances if i.state in INSTANCE_RUNNING),
        "workers": len(snap.workers),
        "idle_workers": sum(1 for w in snap.workers if w.state == "idle"),
    }
    return PolicyInput(
        now=snap.now,
        billing_period_start=start,
        billing_period_end=end,
        hours_left_in_period=hours_left,
        teams=teams,
        queues=queues,
        pools=pools,
        fleet=fleet,
    )


# A demand row: queue, team, gpus, gpu_type, priority, after_reclaim, cpus, memory_mb,
# run-time class, checkpoints, as stored (None kept apart from 0, as the GROUP BY kept
# them), and the interruptions of tasks a reclaim requeued (0 for the others).
_DemandKey = tuple[
    str, str, int | None, str | None, int | None, bool, float | None, int | None, float | None, str | None, int
]


def _order_key(k: _DemandKey) -> tuple[object, ...]:
    """The groups' order: shape columns ascending, NULLs first, as one flat tuple (the
    former key was a pair per column, twelve tuples per group per cycle). Queue, team,
    the reclaim flag and the interruptions are never NULL."""
    q, t, g, gt, prio, reclaimed, c, mem, runtime_s, checkpoints, reclaims = k
    return (
        q,
        t,
        g is not None,
        g,
        gt is not None,
        gt,
        prio is not None,
        prio,
        reclaimed,
        c is not None,
        c,
        mem is not None,
        mem,
        runtime_s is not None,
        runtime_s,
        checkpoints is not None,
        checkpoints,
        reclaims,
    )


def _shape_columns() -> tuple[Any, ...]:
    """The stored columns demand is grouped by, in the order of `ix_tasks_demand`."""
    return (
        Task.queue,
        Task.team,
        Task.gpus,
        Task.gpu_type,
        Task.priority,
        Task.cpus,
        Task.memory_mb,
        Task.runtime_class_s,
        Task.checkpoints,
        Task.end_reason,
    )


_QUEUED_DEMAND = (Task.state == "queued", Task.unschedulable_reason.is_(None))


def demand_query() -> Select[*tuple[Any, ...]]:
    """Queued, schedulable tasks grouped by their stored shape and end reason, in the
    column order of the covering index `ix_tasks_demand`: machines wanted (a gang is
    `nodes` of them), the oldest sort key and the number of tasks (more machines than
    tasks: the shape holds gangs, which `_gangs` takes out as units)."""
    shape = _shape_columns()
    # A task no pool of its queue can run (queueing.unschedulable) is no demand.
    return (
        select(*shape, func.sum(Task.nodes), func.min(Task.sort_key), func.count())
        .where(*_QUEUED_DEMAND)
        .group_by(*shape)
    )


def _gangs_query() -> Select[*tuple[Any, ...]]:
    """Queued gangs, one row each: asked only when the demand query saw one (a shape
    with more machines than tasks), so a fleet without gangs never pays for it."""
    return select(Task.id, *_shape_columns(), Task.nodes, Task.sort_key).where(*_QUEUED_DEMAND, Task.nodes > 1)


def _singles_oldest_query() -> Select[*tuple[Any, ...]]:
    """The oldest sort key of each shape's single-node tasks (only asked with gangs queued)."""
    shape = _shape_columns()
    return select(*shape, func.min(Task.sort_key)).where(*_QUEUED_DEMAND, Task.nodes == 1).group_by(*shape)


def _reserved_ranks_query(task_ids: Sequence[str]) -> Select[*tuple[Any, ...]]:
    """Ranks these queued gangs already hold (machines no longer wanted), per gang."""
    return (
        select(TaskRank.task_id, func.count())
        .where(TaskRank.task_id.in_(task_ids), TaskRank.state == RankState.RESERVED.value)
        .group_by(TaskRank.task_id)
    )


def _demand_key(shape: Sequence[Any]) -> _DemandKey:
    """A row of `_shape_columns` as a demand key: the end reason folded to "after a
    spot reclaim or not", moved after priority."""
    queue, team, gpus, gpu_type, priority, cpus, memory_mb, runtime_s, checkpoints, end_reason = shape
    reclaimed = end_reason == RECLAIMED
    return (queue, team, gpus, gpu_type, priority, reclaimed, cpus, memory_mb, runtime_s, checkpoints, 0)


RECLAIMED = "interrupted:spot"


def _reclaimed_query() -> Select[*tuple[Any, ...]]:
    """Tasks a spot reclaim requeued, by shape and interruptions so far: the capacity
    choice counts each interruption as one boot spent of the task's wait target. A
    separate query (few rows: only tasks requeued by a reclaim), so the demand query
    stays on its covering index."""
    shape = _shape_columns()
    return (
        select(*shape, Task.interruptions, func.sum(Task.nodes), func.min(Task.sort_key))
        .where(*_QUEUED_DEMAND, Task.end_reason == RECLAIMED, Task.nodes < 2)
        .group_by(*shape, Task.interruptions)
    )


def _split_by_reclaims(
    counts: dict[_DemandKey, int], oldest_of: dict[_DemandKey, datetime | None], session: Session
) -> None:
    """Move tasks a reclaim requeued into groups by their interruptions so far; the
    group of those with none keeps the oldest sort key of its own tasks only."""
    left_oldest: dict[_DemandKey, datetime | None] = {}
    split: set[_DemandKey] = set()
    for *columns, interruptions, n, oldest in session.execute(_reclaimed_query()):
        base = _demand_key(columns)
        if base not in counts:
            continue
        if not interruptions:
            first = left_oldest.get(base)
            left_oldest[base] = oldest if first is None or (oldest is not None and oldest < first) else first
            continue
        moved = min(int(n), counts[base])
        if moved <= 0:
            continue
        key = (*base[:-1], int(interruptions))
        counts[base] -= moved
        counts[key] = counts.get(key, 0) + moved
        first = oldest_of.get(key)
        oldest_of[key] = oldest if first is None or (oldest is not None and oldest < first) else first
        split.add(base)
    for base in split:
        oldest_of[base] = left_oldest.get(base)


def _group(key: _DemandKey, count: int, oldest: datetime | None, **gang: Any) -> DemandGroup:
    q, t, g, gt, prio, reclaimed, c, mem, runtime_s, checkpoints, reclaims = key
    return DemandGroup(
        q,
        t,
        int(g or 0),
        gt,
        int(prio or 0),
        count,
        oldest,
        reclaimed,
        float(c or 0.0),
        int(mem or 0),
        float(runtime_s) / 3600.0 if runtime_s else None,
        checkpoints,
        reclaims,
        **gang,
    )


def _demand(session: Session) -> tuple[DemandGroup, ...]:
    """Queued single-node tasks grouped by shape (tasks wanted), oldest sort key per
    group; then each queued gang as a group of its own (`gang`, `nodes`, `reserved`).

    The query groups by the stored columns in the order of the covering index
    `ix_tasks_demand`, end reason included, so SQLite answers it from the index alone
    without a sort; the end reasons are then folded to "after a spot reclaim or not"
    here (a few rows per shape at most). The groups come back in the order the former
    query gave them on SQLite (shape columns ascending, NULLs first, reclaim flag
    after priority): the planner breaks exact ties by input order, so the order is
    part of the plan, and an explicit sort makes it the same on PostgreSQL too."""
    counts: dict[_DemandKey, int] = {}
    oldest_of: dict[_DemandKey, datetime | None] = {}
    with_gangs = False
    for *columns, n, oldest, tasks in session.execute(demand_query()):
        key = _demand_key(columns)
        with_gangs = with_gangs or int(n) != int(tasks)
        if key not in counts:
            counts[key], oldest_of[key] = int(n), oldest
        else:
            counts[key] += int(n)
            first = oldest_of[key]
            if oldest is not None and (first is None or oldest < first):
                oldest_of[key] = oldest
    gangs = _gangs(session, counts) if with_gangs else []
    if gangs:
        # A shape's oldest sort key may have been a gang's: the single tasks' own.
        oldest_of = dict.fromkeys(oldest_of)
        for *columns, oldest in session.execute(_singles_oldest_query()):
            key = _demand_key(columns)
            first = oldest_of.get(key)
            oldest_of[key] = oldest if first is None or (oldest is not None and oldest < first) else first
    _split_by_reclaims(counts, oldest_of, session)
    for key in [k for k, n in counts.items() if n <= 0]:
        del counts[key], oldest_of[key]
    groups = [_group(shape, counts[shape], oldest_of[shape]) for shape in sorted(counts, key=_order_key)]
    return (*groups, *gangs)


def _gangs(session: Session, counts: dict[_DemandKey, int]) -> list[DemandGroup]:
    """The queued gangs as groups of their own, their machines taken out of `counts`
    (which then counts single-node tasks only), oldest first."""
    rows = session.execute(_gangs_query()).all()
    reserved = {str(t): int(n) for t, n in session.execute(_reserved_ranks_query([r[0] for r in rows]))} if rows else {}
    out: list[tuple[Any, DemandGroup]] = []
    for task_id, *columns, nodes, sort_key in rows:
        key = _demand_key(columns)
        if key in counts:
            counts[key] -= int(nodes)
        group = _group(key, 1, sort_key, gang=task_id, nodes=int(nodes), reserved=int(reserved.get(task_id, 0)))
        out.append(((sort_key is None, sort_key, task_id), group))
    out.sort(key=lambda r: r[0])
    return [g for _, g in out]


def _spot_offerings(snap: Snapshot, pool: PoolView) -> list[SpotOfferingInput]:
    """The pool's spot offerings with the ledger's reclaim estimates (the prior's rate
    for one never seen, with no evidence)."""
    prior = snap.capacity.prior_rate if snap.capacity is not None else None
    out: list[SpotOfferingInput] = []
    for o in pool.offerings:
        if o.capacity_type != "spot":
            continue
        est = snap.reclaim.get(o.key)
        if est is None and prior is None:
            continue
        out.append(
            SpotOfferingInput(
                instance_type=o.instance_type,
                zone=o.zone,
                reclaim_rate_per_hour=est.rate if est else prior or 0.0,
                reclaim_rate_sd=est.sd if est and math.isfinite(est.sd) else 0.0,
                instance_hours=est.hours if est else 0.0,
                reclaims=est.reclaims if est else 0.0,
            )
        )
    return out


def _preempted_reasons(session: Session, ids: list[str]) -> dict[str, str]:
    """Why each preempted instance was (the spot notice's words), for its termination's
    reason in `explain`; only the few preempted rows a cycle still has are looked up."""
    if not ids:
        return {}
    rows = session.execute(
        select(InstanceEvent.instance_id, InstanceEvent.reason)
        .where(InstanceEvent.instance_id.in_(ids), InstanceEvent.to_state == "preempted")
        .order_by(InstanceEvent.id)
    )
    return {str(a): str(b) for a, b in rows}
