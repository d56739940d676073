"""Small builders for planner inputs, so each test states only what matters to it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from autoscaler.planner import (
    DemandGroup,
    InstanceView,
    OfferingView,
    PlanInput,
    PoolView,
    QueueView,
    WorkerView,
)
from autoscaler.policy.schema import Decision, TeamDecision

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def offering(
    itype: str = "g.1",
    ct: str = "spot",
    gpus: int = 1,
    price: float = 1.0,
    zone: str | None = "z1",
    gpu_type: str | None = "A10G",
) -> OfferingView:
    return OfferingView(itype, ct, zone, gpus, gpu_type if gpus else None, price)


def pool(
    name: str = "cloud",
    *,
    offerings: tuple[OfferingView, ...] | None = None,
    static: bool = False,
    max_instances: int = 10,
    min_instances: int = 0,
    capacity_types: tuple[str, ...] = ("spot", "on_demand"),
    idle_timeout_s: float = 300,
    boot_timeout_s: float = 600,
    **kw: Any,
) -> PoolView:
    if offerings is None:
        offerings = () if static else (offering(ct="spot", price=0.4), offering(ct="on_demand", price=1.0))
    return PoolView(
        name,
        "static" if static else "fake",
        static,
        capacity_types,
        min_instances,
        max_instances,
        idle_timeout_s,
        boot_timeout_s,
        offerings,
        **kw,
    )


def demand(
    team: str = "vision",
    count: int = 1,
    gpus: int = 1,
    queue: str = "gpu",
    priority: int = 0,
    gpu_type: str | None = None,
    after_reclaim: bool = False,
) -> DemandGroup:
    return DemandGroup(queue, team, gpus, gpu_type, priority, count, NOW, after_reclaim)


def worker(
    wid: str,
    pool_name: str = "cloud",
    *,
    gpus: int = 1,
    used: int = 0,
    state: str = "idle",
    idle_s: float = 0,
    instance_id: str | None = None,
    running: int | None = None,
) -> WorkerView:
    from datetime import timedelta

    idle_since = NOW - timedelta(seconds=idle_s) if state == "idle" else None
    return WorkerView(
        wid,
        pool_name,
        state,
        gpus,
        used,
        used if running is None else running,
        "A10G",
        idle_since,
        instance_id,
    )


def instance(
    iid: str,
    pool_name: str = "cloud",
    *,
    state: str = "ready",
    gpus: int = 1,
    team: str | None = "vision",
    age_s: float = 0,
    worker_id: str | None = None,
    worker_state: str | None = None,
    price: float = 1.0,
) -> InstanceView:
    from datetime import timedelta

    created = NOW - timedelta(seconds=age_s)
    return InstanceView(
        iid,
        pool_name,
        state,
        gpus,
        "A10G",
        "g.1",
        "spot",
        price,
        created,
        team,
        created,
        worker_id,
        worker_state,
    )


def make_input(
    *,
    pools: tuple[PoolView, ...] = (),
    queues: tuple[QueueView, ...] | None = None,
    demand: tuple[DemandGroup, ...] = (),
    workers: tuple[WorkerView, ...] = (),
    instances: tuple[InstanceView, ...] = (),
    decision: Decision | None = None,
    running_gpus: dict[str, int] | None = None,
) -> PlanInput:
    pools = pools or (pool(),)
    if queues is None:
        queues = (
            QueueView("gpu", tuple(p.name for p in pools)),
            QueueView("cpu", tuple(p.name for p in pools)),
        )
    return PlanInput(NOW, queues, pools, demand, workers, instances, decision or Decision(), running_gpus or {})


def decision(**teams: TeamDecision) -> Decision:
    return Decision(teams=dict(teams))
