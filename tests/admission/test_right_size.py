"""Right-sizing (`autoscaler.admission.right_size`): a GPU task does not take a whole
idle machine when a smaller machine of its pool fits it, asked the same way by the
lease (through the real `lease()` on SQLite and PostgreSQL), by the planner's step 2,
and end to end on the real loop in the simulator, where the rule's saving is
hand-computed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select

from autoscaler.admission.fit import Need
from autoscaler.admission.right_size import Size, from_json, held_back, smaller_than, to_json
from autoscaler.config import AutoscalerConfig, InstanceTypeConfig, PoolConfig, QueueConfig, TeamConfig
from autoscaler.planner import plan
from autoscaler.planner.model import InstanceView, OfferingView
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.sim import report
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance
from tests.admission.test_lease_gate import machine
from tests.planner.builders import demand, instance, make_input, offering, pool, worker
from tests.queueing.helpers import add_task, decide, lease
from tests.sim.helpers import run, settings, tasks

H = 3600.0
ONE, FOUR, EIGHT = (offering(f"g.{n}", "on_demand", gpus=n, price=3.0 * n) for n in (1, 4, 8))


def _sized(o: OfferingView, cpus: int, memory_mb: int) -> OfferingView:
    return replace(o, cpus=cpus, memory_mb=memory_mb)


# ------------------------------------------------------------------ the rule, pure


def test_smaller_machines_are_the_pools_smaller_ones_its_first_task_does_not_fit() -> None:
    one, four, eight = (_sized(o, 8 * o.gpus, 61_000 * o.gpus) for o in (ONE, FOUR, EIGHT))
    spot_one = _sized(offering("g.1s", "spot", gpus=1, price=1.0), 8, 61_000)
    t4_one = _sized(offering("t.1", "on_demand", gpus=1, price=1.0, gpu_type="T4"), 8, 61_000)
    pool_offerings = (one, four, eight, spot_one, t4_one)
    # Bought for an 8-GPU task: a 1-GPU and a 4-GPU machine of the same capacity type
    # and GPU type are smaller (spot and T4 offerings are not the same machine).
    assert smaller_than(eight, pool_offerings, Need(8)) == (Size(1, 8.0, 61_000), Size(4, 32.0, 244_000))
    # Bought for a 4-GPU task (the 4-GPU machine could not be had, say): its first task
    # fits the 4-GPU size, so only the 1-GPU size holds work back; it always takes the
    # work it was bought for.
    assert smaller_than(eight, pool_offerings, Need(4)) == (Size(1, 8.0, 61_000),)
    # Bought for a 1-GPU task that asks for more CPUs than the 1-GPU machine has (it
    # fits the 4-GPU one, which could not be had): plain 1-GPU work is held back.
    assert smaller_than(eight, pool_offerings, Need(1, cpus=16)) == (Size(1, 8.0, 61_000),)
    assert smaller_than(eight, pool_offerings, Need(1, cpus=40)) == (Size(1, 8.0, 61_000), Size(4, 32.0, 244_000))
    # The smallest machine, a CPU-only task, a GPU-less machine: no rule.
    assert smaller_than(one, pool_offerings, Need(1)) == ()
    assert smaller_than(eight, pool_offerings, Need(0)) == ()
    # Capacity we do not pay by the hour (a Slurm node priced 0) costs nothing held.
    assert smaller_than(replace(eight, hourly_price=0.0), pool_offerings, Need(8)) == ()


def test_held_back_is_gpu_work_that_a_smaller_machine_fits() -> None:
    smaller = (Size(1, 8.0, 61_000), Size(4, 32.0, 244_000))
    assert held_back(Need(1), smaller)
    assert held_back(Need(3), smaller)
    assert held_back(Need(4, cpus=32, memory_mb=244_000), smaller)
    assert not held_back(Need(5), smaller)
    assert not held_back(Need(2, cpus=40), smaller)  # more CPUs than either has
    assert not held_back(Need(1, memory_mb=300_000), smaller)
    assert not held_back(Need(0, cpus=1), smaller)  # CPU-only work is never held back
    assert not held_back(Need(1), ())
    assert from_json(to_json(smaller)) == smaller and to_json(()) is None and from_json(None) == ()


# ------------------------------------------------------------------ the lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def _rule(sessions, worker_id: str, smaller: tuple[Size, ...]) -> None:
    with transaction(sessions) as s:
        inst = s.scalar(select(Instance).where(Instance.worker_id == worker_id))
        assert inst is not None
        inst.smaller_machines = to_json(smaller)


def test_the_lease_keeps_a_small_task_off_a_whole_large_machine(setup, clock) -> None:
    s = setup.sessions
    big = machine(s, clock, team="vision", gpus=8, price=24.0, cpus=64, memory_mb=488_000)
    _rule(s, big, (Size(1, 8.0, 61_000), Size(4, 32.0, 244_000)))
    decide(s, clock, Decision(teams={"vision": TeamDecision()}))
    small = add_task(s, clock, team="vision", gpus=1)
    clock.advance(1)
    assert lease(s, clock, big) is None  # it waits for a 1-GPU machine
    # Work no smaller machine fits takes it whole, older small work notwithstanding:
    # more GPUs, or more CPUs or memory than the smaller machines have.
    wide = add_task(s, clock, team="vision", gpus=5)
    got = lease(s, clock, big)
    assert got is not None and got.id == wide
    # Now that something runs on it, the machine is filled like any other.
    got = lease(s, clock, big)
    assert got is not None and got.id == small


@pytest.mark.parametrize(
    ("ask", "leased"),
    [
        ({"gpus": 1}, False),
        ({"gpus": 4, "cpus": 32}, False),
        ({"gpus": 1, "cpus": 40}, True),  # more CPUs than the 4-GPU machine's 32
        ({"gpus": 2, "memory_mb": 300_000}, True),
        ({"gpus": 5}, True),
    ],
)
def test_the_lease_asks_what_the_pure_rule_answers(setup, clock, ask: dict[str, int], leased: bool) -> None:
    s = setup.sessions
    smaller = (Size(1, 8.0, 61_000), Size(4, 32.0, 244_000))
    big = machine(s, clock, team="vision", gpus=8, price=24.0, cpus=64, memory_mb=488_000)
    _rule(s, big, smaller)
    decide(s, clock, Decision(teams={"vision": TeamDecision()}))
    t = add_task(s, clock, team="vision", **ask)
    assert held_back(Need(ask["gpus"], None, ask.get("cpus", 0), ask.get("memory_mb", 0)), smaller) is not leased
    got = lease(s, clock, big)
    assert (got is not None and got.id == t) is leased


def test_cpu_only_work_and_machines_without_the_rule_lease_as_before(setup, clock) -> None:
    s = setup.sessions
    big = machine(s, clock, team="vision", gpus=8, price=24.0)
    _rule(s, big, (Size(1, 8.0, 61_000),))
    plain = machine(s, clock, team="vision", gpus=8, price=24.0)
    decide(s, clock, Decision(teams={"vision": TeamDecision()}))
    cpu = add_task(s, clock, team="vision", gpus=0)
    got = lease(s, clock, big)
    assert got is not None and got.id == cpu
    one = add_task(s, clock, team="vision", gpus=1)
    got = lease(s, clock, plain)
    assert got is not None and got.id == one


# ------------------------------------------------------------------ the planner


def _big(iid: str = "i-big", smaller: tuple[Size, ...] = (Size(1, 1.0, 1024), Size(4, 1.0, 1024))) -> InstanceView:
    return replace(instance(iid, gpus=8, worker_id="w-big", worker_state="idle", price=24.0), smaller=smaller)


def test_step_2_does_not_count_a_whole_large_machine_for_a_small_task() -> None:
    cloud = pool(offerings=(ONE, FOUR, EIGHT))
    inp = make_input(
        pools=(cloud,),
        demand=(demand(gpus=1),),
        workers=(worker("w-big", gpus=8, instance_id="i-big"),),
        instances=(_big(),),
    )
    p = plan(inp)
    assert p.placed_on_existing == 0
    assert [x.offering.instance_type for x in p.launches] == ["g.1"]
    assert p.right_size_lifted == ()
    # A 5-GPU task is what the machine is for.
    p = plan(make_input(pools=(cloud,), demand=(demand(gpus=5),), workers=inp.workers, instances=inp.instances))
    assert p.placed_on_existing == 1 and p.launches == ()


def test_a_pool_at_its_max_lifts_the_rule_in_the_plan_and_for_the_lease() -> None:
    full = pool(offerings=(ONE, FOUR, EIGHT), max_instances=1)
    p = plan(
        make_input(
            pools=(full,),
            demand=(demand(gpus=1),),
            workers=(worker("w-big", gpus=8, instance_id="i-big"),),
            instances=(_big(),),
        )
    )
    # No smaller machine can be bought: the task goes where it fits, and the
    # reconciler clears the instance's rule so the lease agrees.
    assert p.placed_on_existing == 1 and p.launches == ()
    assert p.right_size_lifted == ("i-big",)


def test_a_launch_records_the_smaller_machines_for_the_instance() -> None:
    cloud = pool(offerings=(ONE, FOUR, EIGHT))
    p = plan(make_input(pools=(cloud,), demand=(demand(gpus=8), demand(gpus=1, team="nlp"))))
    by_type = {x.offering.instance_type: x.smaller for x in p.launches}
    assert by_type == {"g.8": (Size(1, 1.0, 1024), Size(4, 1.0, 1024)), "g.1": ()}


def test_a_booting_large_machine_is_not_counted_for_a_small_task() -> None:
    cloud = pool(offerings=(ONE, FOUR, EIGHT))
    booting = replace(instance("i-boot", state="launching", gpus=8, price=24.0), smaller=(Size(1, 1.0, 1024),))
    p = plan(make_input(pools=(cloud,), demand=(demand(gpus=1),), instances=(booting,)))
    assert p.placed_on_existing == 0 and [x.offering.instance_type for x in p.launches] == ["g.1"]
    # Without the rule (an instance from before it, say) it counts as before.
    old = replace(booting, smaller=())
    p = plan(make_input(pools=(cloud,), demand=(demand(gpus=1),), instances=(old,)))
    assert p.placed_on_existing == 1 and p.launches == ()


# ------------------------------------------------------------------ end to end


def _sizes_pool() -> AutoscalerConfig:
    pool_cfg = PoolConfig(
        name="p",
        provider="fake",
        region="us-east-1",
        zones=["us-east-1a"],
        capacity_types=["on_demand"],
        instance_types=[
            InstanceTypeConfig(name=f"g{n}", gpus=n, gpu_type="V100", on_demand_price=3.0 * n) for n in (1, 4, 8)
        ],
        max_instances=50,
        idle_timeout_s=300,
    )
    return AutoscalerConfig(
        deployment="sim",
        teams=[TeamConfig(name="lab")],
        queues=[QueueConfig(name="gpu", pools=["p"])],
        pools=[pool_cfg],
    )


def test_a_long_small_task_after_a_wide_one_gets_its_own_machine_on_the_real_loop(tmp_path: Path) -> None:
    # An 8-GPU task runs 1 h from t=0; a 1-GPU task of 10 h arrives 60 s after it ends,
    # while its 8-GPU machine (24 USD/h) sits idle. Before the rule the small task took
    # that machine and held its eight GPUs for 10 h (240 USD); now it waits one boot
    # (120 s) for a 1-GPU machine (3 USD/h: 30 USD of work) and the large one idles out.
    boot = 120.0
    out = run(
        tasks(("lab", 0.0, H, 8), ("lab", boot + H + 60.0, 10 * H, 1)),
        _sizes_pool(),
        tmp_path,
        settings(),
    )
    rep = report.build(out, None)
    gap = rep["gap_to_reclaim_aware_bound"]["parts_usd"]
    assert gap["idle_partial"] == 0.0
    small = next(t for t in out.tasks.values() if t.trace.key == "t1")
    assert small.finished_s is not None and boot <= small.wait_s <= boot + 60.0
    machines = sorted((i.gpus, i.price) for i in out.instances.values())
    assert machines == [(1, 3.0), (8, 24.0)]
    # Bound: 8 GPUs x 1 h at 3 USD + 1 GPU x 10 h at 3 USD = 54 USD; ours adds the two
    # boots and the large machine's idle timeout, nothing per GPU of the long task.
    assert rep["total_cost_usd"] < 54.0 + 24.0 * (boot + 300.0 + 60.0) / H + 3.0 * (boot + 60.0) / H + 1.0
