"""Spot instance records as the ledger keeps them, for tests of reclaim evidence: one
g.1 machine of gpu-pool that lived `hours`, ended `ended_h_ago` hours ago (None: still
running), reclaimed or not."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy.orm import Session

from autoscaler.clock import Clock
from autoscaler.state.models import Instance, InstanceEvent, new_id


def add_spot_life(
    s: Session,
    clock: Clock,
    *,
    hours: float,
    ended_h_ago: float | None,
    reclaimed: bool,
    zone: str = "z1",
    ct: str = "spot",
) -> str:
    now = clock.now()
    end = None if ended_h_ago is None else now - timedelta(hours=ended_h_ago)
    start = (end or now) - timedelta(hours=hours)
    inst = Instance(
        id=new_id(),
        request_id=new_id(),
        provider="fake",
        pool="gpu-pool",
        instance_type="g.1",
        capacity_type=ct,
        zone=zone,
        gpus=1,
        state="terminated" if end else "ready",
        hourly_price=0.4,
        created_at=start,
        updated_at=end or now,
        launched_at=start,
        terminated_at=end,
    )
    s.add(inst)
    s.flush()
    if reclaimed:
        s.add(
            InstanceEvent(instance_id=inst.id, at=end or now, from_state="ready", to_state="preempted", reason="spot")
        )
    return inst.id
