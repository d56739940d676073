"""Static (on-prem) pools in the running reconciler: `build_providers` builds them, their
workers are capacity the planner fills first, their declared machines are never adopted,
orphaned, launched or terminated, and the shipped policy's on-prem-first rule sees them.

The reconciler, planner, shipped policy and queueing functions are real; the cloud pool
is the fake provider on a manual clock; agents' moves (register, lease, finish) are the
server-side queueing calls an agent's HTTP requests make. Real agent processes on a
static pool run in tests/hybrid.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.auth.tokens import create_token
from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.errors import ConfigError
from autoscaler.policy.service import PolicyService
from autoscaler.queueing import workers as worker_ops
from autoscaler.reconciler.component import build_providers
from autoscaler.state.db import transaction
from providers.base import Provider
from providers.static import StaticProvider
from tests.reconciler.harness import Rig, make_rig

CONFIG = """
deployment: test
teams: [{name: vision}]
queues:
  # The cloud pool is listed first on purpose: cost order, not list order, puts on-prem first.
  - {name: gpu, pools: [cloud, onprem], priority: 10}
reconcile: {orphan_grace_s: 30}
pools:
  - name: onprem
    provider: static
    idle_timeout_s: 60
    instance_types: [{name: dgx, gpus: 1, gpu_type: A10G}]
    options:
      machines: [{name: onprem-01, gpus: 1, gpu_type: A10G}, onprem-02]
  - name: cloud
    provider: fake
    max_instances: 4
    idle_timeout_s: 60
    instance_types: [{name: g.1, gpus: 1, gpu_type: A10G, on_demand_price: 1.0, spot_price: 0.4}]
"""


@pytest.fixture
def static_config() -> AutoscalerConfig:
    return parse_config(CONFIG, Path("static.yaml"))


@pytest.fixture
def srig(
    sqlite_sessions: sessionmaker[Session],
    static_config: AutoscalerConfig,
    clock: ManualClock,
    shipped_policy: PolicyService,
    tmp_path: Path,
) -> Rig:
    return make_rig(sqlite_sessions, static_config, clock, shipped_policy)


def providers_of(rig: Rig, tmp_path: Path) -> dict[str, Provider]:
    """What `autoscaler up` builds, with the cloud pool swapped for the rig's clocked fake."""
    built = build_providers(rig.config, SimpleNamespace(home=tmp_path))  # type: ignore[arg-type]
    return {**built, "cloud": rig.fakes["cloud"]}


def register_onprem(rig: Rig, machine: str) -> str:
    """An agent started by hand on an on-prem machine, with a join token for the pool."""
    with transaction(rig.sessions) as s:
        _, join = create_token(s, kind="join", now=rig.clock.now(), pool="onprem")
        reg = worker_ops.Registration(
            hostname=machine,
            instance_id=machine,
            provider="static",
            pool="onprem",
            gpus=[{"index": 0, "model": "A10G"}],
        )
        worker, _ = worker_ops.register(s, join, reg, now=rig.clock.now())
        return worker.id


def test_build_providers_includes_static_pools_and_reports_bad_machines(
    static_config: AutoscalerConfig, tmp_path: Path
) -> None:
    built = build_providers(static_config, SimpleNamespace(home=tmp_path))  # type: ignore[arg-type]
    onprem = built["onprem"]
    assert isinstance(onprem, StaticProvider) and onprem.capabilities.static
    assert [m.name for m in onprem.machines] == ["onprem-01", "onprem-02"]
    bad = static_config.model_copy(deep=True)
    bad.pools[0].options = {"machines": [{"name": "x", "gpu": 8}]}
    with pytest.raises(ConfigError, match=r"pool 'onprem': invalid static pool options.machines.0.gpu: unknown option"):
        build_providers(bad, SimpleNamespace(home=tmp_path))  # type: ignore[arg-type]


def test_onprem_fills_first_cloud_takes_overflow_and_is_drained_first(srig: Rig, tmp_path: Path) -> None:
    rig = srig
    r = rig.reconciler(providers_of(rig, tmp_path))
    fake = rig.fakes["cloud"]
    on1 = register_onprem(rig, "onprem-01")

    # One task: the idle on-prem machine takes it, nothing is bought, and the shipped
    # policy sees that machine (on-prem first holds the cloud pool at its size).
    rig.enqueue()
    decision = r.evaluate(r.observe(rig.clock.now())).decision
    assert decision.pools["cloud"].max_instances == 0
    assert "on-prem first, 1 idle on-prem machine(s) cover the backlog of 1 task(s)" in " ".join(
        decision.pools["cloud"].reasons
    )
    first = r.run_cycle()
    assert first.plan.placed_on_existing == 1 and first.plan.launches == () and fake.calls_of("launch") == []
    # onprem-02 is declared but runs no agent: reported, never adopted nor orphaned.
    assert first.static_without_agent == ["onprem-02"] and first.orphans == [] and first.adopted == []
    t1 = rig.lease(on1)
    assert t1 is not None

    # A second task overflows: the on-prem machine is busy, so the cloud launches one.
    rig.enqueue()
    second = r.run_cycle()
    assert [(x.pool, x.offering.capacity_type) for x in second.plan.launches] == [("cloud", "spot")]
    assert all(c.arg.pool == "cloud" for c in fake.calls_of("launch"))
    (inst,) = rig.instances()
    cl = rig.register(rig.instance(inst.id))
    r.run_cycle()
    t2 = rig.lease(cl)
    assert t2 is not None
    rig.finish(on1, t1)
    rig.finish(cl, t2)

    # Demand falls: both idle past the timeout, one new task. The planner counts it
    # against on-prem (cost 0) and drains the cloud worker; the on-prem one stays.
    rig.clock.advance(120)
    rig.heartbeat(on1)
    rig.heartbeat(cl)
    rig.enqueue()
    third = r.run_cycle()
    assert third.drained == [cl] and third.plan.launches == ()
    assert rig.worker(on1).state == "idle"
    # Far past the orphan grace: the declared machines are still not orphans.
    assert third.orphans == [] and third.static_without_agent == ["onprem-02"]
    t3 = rig.lease(on1)
    assert t3 is not None
    rig.leave(cl)  # the cloud agent exits after its drain
    fourth = r.run_cycle()
    assert fourth.terminated == [inst.id] and fake.live() == []
    rig.finish(on1, t3)

    # No demand at all for a long time: on-prem is never drained for idleness (it costs
    # nothing to keep), never terminated, and no instance row ever exists for it.
    rig.clock.advance(3600)
    rig.heartbeat(on1)
    quiet = r.run_cycle()
    assert quiet.drained == [] and quiet.terminated == [] and quiet.plan.drains == ()
    assert rig.worker(on1).state == "idle"
    assert [i.pool for i in rig.instances()] == ["cloud"]


def test_static_worker_is_not_a_launch_target_even_when_full(srig: Rig, tmp_path: Path) -> None:
    rig = srig
    cloud_max_zero: Any = rig.config.model_copy(deep=True)
    cloud_max_zero.pools[1].max_instances = 0
    rig.config = cloud_max_zero
    r = rig.reconciler(providers_of(rig, tmp_path))
    on1 = register_onprem(rig, "onprem-01")
    rig.enqueue()
    rig.enqueue()
    res = r.run_cycle()
    # One fits on-prem; the other waits: a static pool is never launched into.
    assert res.plan.placed_on_existing == 1 and res.launched == [] and res.launch_errors == []
    (held,) = res.plan.holds
    assert "static pool onprem is full" in held.reason and "pool cloud at its max of 0" in held.reason
    assert rig.lease(on1) is not None
