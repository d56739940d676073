"""The snapshot's running checkpointing work on spot: what standby machines are sized by.

Real databases (SQLite and PostgreSQL), rows inserted as the queue and the reconciler
store them. Only active, single-node, checkpointing tasks on live spot machines count,
each at its machine's offering's reclaim rate (the capacity model's estimate, the
prior for an offering never seen), grouped by the shape a replacement must fit.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig
from autoscaler.planner.capacity_choice import CapacityModel
from autoscaler.planner.standby import Shape
from autoscaler.queueing.capacity_view import capacity_model, standby_on
from autoscaler.queueing.queues import sync_from_config
from autoscaler.reconciler.snapshot import standby_exposure
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, Task

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def _instance(iid: str, worker: str, *, ct: str = "spot", zone: str = "z1", state: str = "ready") -> dict[str, Any]:
    return dict(
        id=iid,
        request_id=f"r-{iid}",
        provider="fake",
        pool="gpu-pool",
        instance_type="g.1",
        capacity_type=ct,
        zone=zone,
        gpus=4,
        state=state,
        hourly_price=0.4,
        worker_id=worker,
        created_at=NOW - timedelta(hours=2),
        updated_at=NOW,
    )


def _task(tid: str, worker: str | None, **kw: Any) -> dict[str, Any]:
    row: dict[str, Any] = dict(
        id=tid,
        queue="gpu",
        team="vision",
        command=["x"],
        env={},
        gpus=1,
        priority=0,
        state="running",
        worker_id=worker,
        checkpoints="on-signal",
        sort_key=NOW,
        created_at=NOW,
        updated_at=NOW,
        gpu_indices=[],
    )
    row.update(kw)
    return row


H = 3600.0


def test_only_checkpointing_work_on_live_spot_that_needs_it_counts_each_at_its_machines_rate(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    with transaction(sessions) as s:
        sync_from_config(s, config, now=NOW)
        s.execute(
            insert(Instance),
            [
                _instance("i-calm", "w-calm", zone="z1"),
                _instance("i-storm", "w-storm", zone="z2"),
                _instance("i-od", "w-od", ct="on_demand"),
                _instance("i-gone", "w-gone", state="terminated"),
            ],
        )
        s.execute(
            insert(Task),
            [
                _task("t1", "w-calm", runtime_class_s=1000 * H),
                _task("t2", "w-calm", checkpoints="every:30", runtime_class_s=500 * H),
                _task("t3", "w-storm", runtime_class_s=100 * H),
                _task("t4", "w-calm", gpus=2, runtime_class_s=1000 * H),  # another shape
                # 10 h at 0.1/h: one reclaim expected, P(more than 9) ~ 1e-7: keeps the
                # target without standby.
                _task("t5", "w-calm", runtime_class_s=10 * H),
                # 1,000 h, but 999.9 of them ran: six minutes left.
                _task("t6", "w-calm", runtime_class_s=1000 * H, created_at=NOW - timedelta(hours=999.9)),
                _task("t7", "w-calm"),  # no run-time estimate: the 1 h default
                # Estimated at 1 h but running for 100: as long again is expected, at
                # 0.1/h 10 reclaims: needs standby.
                _task("t14", "w-calm", runtime_class_s=1 * H, created_at=NOW - timedelta(hours=100)),
                _task("t8", "w-calm", checkpoints="none", runtime_class_s=1000 * H),  # restarts from zero
                _task("t9", "w-calm", checkpoints=None, runtime_class_s=1000 * H),  # declared nothing
                _task("t10", "w-od", runtime_class_s=1000 * H),  # on-demand is never reclaimed
                _task("t11", "w-gone", runtime_class_s=1000 * H),  # a terminated machine's row
                _task("t12", "w-calm", state="queued", runtime_class_s=1000 * H),  # not running
                _task("t13", "w-calm", nodes=2, runtime_class_s=1000 * H),  # a gang's ranks
            ],
        )
    rates = {"spot/g.1/z1": 0.1, "spot/g.1/z2": 0.6}
    model = CapacityModel(rates, prior_rate=0.24, boot_h=0.05, wait_target_h=0.5, standby_miss=0.05)
    with sessions() as s:
        standby = standby_exposure(s, model, NOW)
    one, two = Shape("vision", "gpu", 1), Shape("vision", "gpu", 2)
    assert set(standby.exposure) == {one, two}
    assert standby.exposure[one].tasks == 4
    assert standby.exposure[one].reclaims_per_hour == pytest.approx(0.1 + 0.1 + 0.6 + 0.1)
    assert standby.exposure[one].runtime_h == 1000.0
    assert (standby.exposure[two].tasks, standby.exposure[two].reclaims_per_hour) == (1, pytest.approx(0.1))
    # Each shape is sized for the most exposed of its tasks: the least miss chance any
    # needs (t1: 1,000 h at 0.1/h, 5.43 / 100.5 expected reclaims), never below 1 %.
    assert standby.exposure[one].miss == pytest.approx(model.standby_miss_needed("spot/g.1/z1", 1000.0, "on-signal", 0))
    assert standby.exposure[one].miss == pytest.approx(0.054, abs=1e-3)
    assert standby.boot_h == 0.05 and standby.miss == 0.05  # the model's own
    with sessions() as s:
        # An offering with no estimate counts at the prior.
        prior = standby_exposure(s, replace(model, reclaim_rates={}), NOW)
        assert prior.exposure[Shape("vision", "gpu", 1)].reclaims_per_hour == pytest.approx(0.96)
        # Without a wait target no task needs standby.
        assert standby_exposure(s, replace(model, wait_target_h=None), NOW).exposure == {}


def test_standby_is_on_only_with_a_wait_target_and_can_be_turned_off(config: AutoscalerConfig) -> None:
    cap = config.capacity
    assert not standby_on(cap)  # no wait target by default
    target = cap.model_copy(update={"wait_target_s": 1800.0})
    assert standby_on(target) and capacity_model(target, {}).standby_miss == 0.01
    off = target.model_copy(update={"standby": False})
    assert not standby_on(off) and capacity_model(off, {}).standby_miss is None
    assert not standby_on(target.model_copy(update={"enabled": False}))
