"""Table-driven cases for the planner: one behaviour per test, stated in its name."""

from __future__ import annotations

from autoscaler.planner import DemandGroup, QueueView, plan
from autoscaler.policy.schema import Decision, PoolDecision, TeamDecision
from tests.planner.builders import decision, demand, instance, make_input, offering, pool, worker


def test_no_demand_no_launch() -> None:
    assert plan(make_input()).launches == ()


def test_one_gpu_task_launches_cheapest_spot_offering_for_its_team() -> None:
    p = plan(make_input(demand=(demand("vision", 1),)))
    assert len(p.launches) == 1
    launch = p.launches[0]
    assert (launch.offering.capacity_type, launch.team, launch.pool) == ("spot", "vision", "cloud")
    assert launch.answers == (("gpu", 1),)
    assert "vision" in launch.reason


def test_idle_and_booting_capacity_is_used_before_launching() -> None:
    inp = make_input(
        demand=(demand(count=3),),
        workers=(worker("w1", gpus=1),),
        instances=(instance("i-boot", state="booting", gpus=1, worker_id=None),),
    )
    p = plan(inp)
    assert p.placed_on_existing == 2
    assert len(p.launches) == 1


def test_tasks_are_packed_first_fit_decreasing_into_larger_shapes() -> None:
    # An 8-GPU machine at 4/h is 0.5 per GPU; eight 1-GPU machines cost 1/h each.
    cloud = pool(offerings=(offering("g.1", gpus=1, price=1.0), offering("g.8", gpus=8, price=4.0)))
    p = plan(make_input(pools=(cloud,), demand=(demand(count=4, gpus=2),)))
    assert [x.offering.instance_type for x in p.launches] == ["g.8"]
    assert sum(g for x in p.launches for _, g in x.answers) == 8


def test_cost_per_useful_gpu_prefers_small_shape_for_small_demand() -> None:
    # One 1-GPU task: the 8-GPU machine's useful GPUs are 1, so it costs 4/GPU.
    cloud = pool(offerings=(offering("g.1", gpus=1, price=1.0), offering("g.8", gpus=8, price=4.0)))
    p = plan(make_input(pools=(cloud,), demand=(demand(count=1),)))
    assert [x.offering.instance_type for x in p.launches] == ["g.1"]


def test_cpu_work_never_launches_a_gpu_machine() -> None:
    cloud = pool(offerings=(offering("g.1", gpus=1, price=0.05), offering("c.1", gpus=0, price=0.1)))
    p = plan(make_input(pools=(cloud,), demand=(demand(gpus=0, queue="cpu"),)))
    assert [x.offering.instance_type for x in p.launches] == ["c.1"]
    gpu_only = pool(offerings=(offering("g.1", gpus=1, price=0.05),))
    held = plan(make_input(pools=(gpu_only,), demand=(demand(gpus=0, queue="cpu"),)))
    assert held.launches == () and "CPU-only" in held.holds[0].reason


def test_blocked_spot_offering_falls_back_to_on_demand() -> None:
    cloud = pool(blocked=frozenset({"spot/g.1/z1"}))
    p = plan(make_input(pools=(cloud,), demand=(demand(),)))
    assert [x.offering.capacity_type for x in p.launches] == ["on_demand"]


def test_blocked_zone_falls_back_to_another_zone() -> None:
    cloud = pool(
        offerings=(offering(zone="z1", price=0.4), offering(zone="z2", price=0.5)),
        blocked=frozenset({"zone:z1"}),
    )
    p = plan(make_input(pools=(cloud,), demand=(demand(),)))
    assert [x.offering.zone for x in p.launches] == ["z2"]


def test_work_reclaimed_on_spot_is_relaunched_on_demand() -> None:
    p = plan(make_input(demand=(demand("vision", 1, after_reclaim=True), demand("nlp", 1))))
    by_team = {x.team: x.offering.capacity_type for x in p.launches}
    assert by_team == {"vision": "on_demand", "nlp": "spot"}


def test_reclaimed_work_of_a_spot_only_team_stays_on_spot() -> None:
    d = decision(vision=TeamDecision(allowed_capacity_types=["spot"]))
    p = plan(make_input(demand=(demand(after_reclaim=True),), decision=d))
    assert [x.offering.capacity_type for x in p.launches] == ["spot"]


def test_policy_capacity_types_exclude_spot() -> None:
    d = decision(vision=TeamDecision(allowed_capacity_types=["on_demand"]))
    p = plan(make_input(demand=(demand(),), decision=d))
    assert [x.offering.capacity_type for x in p.launches] == ["on_demand"]


def test_pool_max_caps_launches_and_says_why() -> None:
    p = plan(make_input(pools=(pool(max_instances=2),), demand=(demand(count=5),)))
    assert len(p.launches) == 2
    assert p.holds[0].tasks == 3 and "max of 2" in p.holds[0].reason


def test_policy_pool_cap_tightens_but_never_widens_config() -> None:
    tight = Decision(pools={"cloud": PoolDecision(max_instances=1)})
    assert (
        len(plan(make_input(pools=(pool(max_instances=3),), demand=(demand(count=5),), decision=tight)).launches) == 1
    )
    wide = Decision(pools={"cloud": PoolDecision(max_instances=50)})
    assert len(plan(make_input(pools=(pool(max_instances=3),), demand=(demand(count=5),), decision=wide)).launches) == 3


def test_spend_headroom_limits_new_capacity() -> None:
    d = decision(vision=TeamDecision(spend_headroom_per_hour=1.0))
    p = plan(make_input(demand=(demand(count=5),), decision=d))
    assert len(p.launches) == 2  # 2 x 0.4 spot; a third would exceed 1.0 USD/h
    assert "headroom" in p.holds[0].reason


def test_frozen_team_holds_with_policy_reason() -> None:
    d = decision(vision=TeamDecision(may_scale_up=False, reasons=["92 % of 10,000 USD budget (budgets.rego)"]))
    p = plan(make_input(demand=(demand(count=2), demand("nlp")), decision=d))
    assert [x.team for x in p.launches] == ["nlp"]
    assert any("budgets.rego" in h.reason and h.team == "vision" for h in p.holds)


def test_priority_tier_wins_when_capacity_is_short() -> None:
    d = decision(nlp=TeamDecision(priority_tier=1))
    p = plan(make_input(pools=(pool(max_instances=2),), demand=(demand("vision", 3), demand("nlp", 3)), decision=d))
    assert [x.team for x in p.launches] == ["nlp", "nlp"]


def test_weighted_fair_share_splits_short_capacity() -> None:
    d = decision(vision=TeamDecision(priority_weight=3.0), nlp=TeamDecision(priority_weight=1.0))
    p = plan(make_input(pools=(pool(max_instances=8),), demand=(demand("vision", 10), demand("nlp", 10)), decision=d))
    teams = [x.team for x in p.launches]
    assert teams.count("vision") == 6 and teams.count("nlp") == 2


def test_fair_share_counts_gpus_already_running() -> None:
    p = plan(
        make_input(
            pools=(pool(max_instances=4),),
            demand=(demand("vision", 4), demand("nlp", 4)),
            running_gpus={"vision": 4},
        )
    )
    assert [x.team for x in p.launches] == ["nlp"] * 4


def test_static_pool_is_used_before_cloud_and_cloud_takes_overflow() -> None:
    onprem = pool("onprem", static=True)
    cloud = pool("cloud")
    queues = (QueueView("gpu", ("cloud", "onprem")),)
    inp = make_input(
        pools=(onprem, cloud),
        queues=queues,
        demand=(demand(count=3),),
        workers=(worker("w-on1", "onprem"), worker("w-on2", "onprem"), worker("w-cl", "cloud")),
    )
    p = plan(inp)
    # Two tasks go on-prem, one onto the idle cloud worker; nothing is bought.
    assert p.placed_on_existing == 3 and p.launches == ()


def test_cloud_drains_first_when_demand_falls() -> None:
    onprem = pool("onprem", static=True)
    cloud = pool("cloud", idle_timeout_s=60)
    queues = (QueueView("gpu", ("cloud", "onprem")),)
    inp = make_input(
        pools=(onprem, cloud),
        queues=queues,
        demand=(demand(count=1),),
        workers=(
            worker("w-on", "onprem", idle_s=600),
            worker("w-cl", "cloud", idle_s=600, instance_id="i-cl"),
        ),
        instances=(instance("i-cl", worker_id="w-cl", worker_state="idle"),),
    )
    p = plan(inp)
    assert [d.worker_id for d in p.drains] == ["w-cl"]
    assert p.placed_on_existing == 1


def test_idle_worker_past_timeout_is_drained_idle_only() -> None:
    inp = make_input(
        pools=(pool(idle_timeout_s=60),),
        workers=(worker("w1", idle_s=61, instance_id="i1"),),
        instances=(instance("i1", worker_id="w1", worker_state="idle"),),
    )
    (d,) = plan(inp).drains
    assert d.only_if_idle and d.worker_id == "w1" and d.instance_id == "i1"


def test_idle_worker_before_timeout_or_needed_is_kept() -> None:
    young = make_input(pools=(pool(idle_timeout_s=60),), workers=(worker("w1", idle_s=59),))
    assert plan(young).drains == ()
    needed = make_input(pools=(pool(idle_timeout_s=60),), workers=(worker("w1", idle_s=600),), demand=(demand(),))
    assert plan(needed).drains == ()


def test_pool_min_is_kept_when_draining_and_filled_when_short() -> None:
    inp = make_input(
        pools=(pool(idle_timeout_s=60, min_instances=1),),
        workers=(worker("w1", idle_s=600, instance_id="i1"),),
        instances=(instance("i1", worker_id="w1", worker_state="idle"),),
    )
    assert plan(inp).drains == ()
    empty = plan(make_input(pools=(pool(min_instances=2),)))
    assert len(empty.launches) == 2 and all(x.answers == () for x in empty.launches)


def test_boot_timeout_lost_preempted_and_drained_are_terminated() -> None:
    inp = make_input(
        instances=(
            instance("i-slow", state="booting", age_s=601),
            instance("i-fresh", state="booting", age_s=10),
            instance("i-pre", state="preempted"),
            instance("i-lost", state="ready", worker_id="w9", worker_state="gone"),
            instance("i-drained", state="draining", worker_id="w8", worker_state="gone"),
        )
    )
    t = {x.instance_id: x for x in plan(inp).terminations}
    assert set(t) == {"i-slow", "i-pre", "i-lost", "i-drained"}
    assert t["i-slow"].mark == "boot_timeout" and t["i-lost"].mark == "lost"


def test_preempted_capacity_is_replaced_for_requeued_work() -> None:
    inp = make_input(demand=(demand(),), instances=(instance("i-pre", state="preempted"),))
    p = plan(inp)
    assert [t.instance_id for t in p.terminations] == ["i-pre"]
    assert len(p.launches) == 1


def test_team_over_hard_budget_is_drained_and_not_grown() -> None:
    d = decision(vision=TeamDecision(drain=True, may_scale_up=False))
    inp = make_input(
        demand=(demand("vision"),),
        workers=(
            worker("w1", state="busy", used=1, instance_id="i1"),
            worker("w2", state="busy", used=1, instance_id="i2"),
        ),
        instances=(
            instance("i1", worker_id="w1", worker_state="busy"),
            instance("i2", worker_id="w2", worker_state="busy", team="nlp"),
            instance("i3", state="booting", age_s=5),
        ),
        decision=d,
    )
    p = plan(inp)
    assert [(x.worker_id, x.only_if_idle) for x in p.drains] == [("w1", False)]
    assert [t.instance_id for t in p.terminations] == ["i3"]
    assert p.launches == () and "hard budget" in p.holds[0].reason


def test_backoff_pool_is_skipped_for_the_next_pool() -> None:
    from datetime import timedelta

    from tests.planner.builders import NOW

    a = pool("a", backoff_until=NOW + timedelta(seconds=30))
    b = pool("b", offerings=(offering(price=0.9),))
    p = plan(make_input(pools=(a, b), demand=(demand(),)))
    assert [x.pool for x in p.launches] == ["b"]


def test_gpu_type_is_matched() -> None:
    cloud = pool(
        offerings=(
            offering("g.a10", gpu_type="A10G", price=1.0),
            offering("g.a100", gpu_type="NVIDIA A100-SXM4-80GB", price=3.0),
        )
    )
    p = plan(make_input(pools=(cloud,), demand=(demand(gpu_type="A100"),)))
    assert [x.offering.instance_type for x in p.launches] == ["g.a100"]


def test_fail_safe_decision_freezes_growth_and_keeps_running_work() -> None:
    inp = make_input(
        demand=(demand(),),
        decision=Decision.failed("syntax error in budgets.rego:3"),
        workers=(worker("w1", state="busy", used=1),),
    )
    p = plan(inp)
    assert p.launches == () and p.drains == ()
    assert "budgets.rego:3" in p.notes[0]


def test_policy_queue_placement_and_pool_order_are_honoured() -> None:
    from autoscaler.policy.schema import QueueDecision

    a, b = pool("a", offerings=(offering(price=0.1),)), pool("b", offerings=(offering(price=0.9),))
    queues = (QueueView("gpu", ("a", "b")),)
    restricted = Decision(queues={"gpu": QueueDecision(allowed_pools=["b"])})
    p = plan(make_input(pools=(a, b), queues=queues, demand=(demand(),), decision=restricted))
    assert [x.pool for x in p.launches] == ["b"]
    ordered = Decision(pool_order=["b", "a"])
    p = plan(make_input(pools=(a, b), queues=queues, demand=(demand(),), decision=ordered))
    assert [x.pool for x in p.launches] == ["b"]


def test_a_machine_the_work_cannot_fill_gives_way_to_a_later_pool_that_fits_it() -> None:
    # The simulator's V100s on-demand: pool "aws" (first in the policy's order) has
    # only a 4-GPU machine at 12.24 USD/h; "azure" a 2-GPU one at 6.12 USD/h.
    aws = pool("aws", offerings=(offering("p3.8xlarge", "on_demand", gpus=4, price=12.24),))
    azure = pool("azure", offerings=(offering("NC12s", "on_demand", gpus=2, price=6.12),))
    queues = (QueueView("gpu", ("aws", "azure")),)
    order = Decision(pool_order=["aws", "azure"])

    def launched(*groups: DemandGroup) -> list[tuple[str, str]]:
        p = plan(make_input(pools=(aws, azure), queues=queues, demand=groups, decision=order))
        return [(x.pool, x.offering.instance_type) for x in p.launches]

    # One 2-GPU task: on aws it uses 2 of 4 GPUs, 12.24 / 2 = 6.12 USD per GPU-hour;
    # on azure 6.12 / 2 = 3.06. The later pool wins.
    assert launched(demand(gpus=2)) == [("azure", "NC12s")]
    # Two 2-GPU tasks would fill the 4-GPU machine, 3.06 per GPU-hour as on azure:
    # at equal cost the machine of the task's own size goes (one 4-GPU machine would
    # be held until the longer of the two ends), one per task.
    assert launched(demand(gpus=2, count=2)) == [("azure", "NC12s"), ("azure", "NC12s")]
    # ...but a 4-GPU machine cheaper per GPU (11.0 / 4 = 2.75) keeps them together.
    cheap = pool("aws", offerings=(offering("p3.8xlarge", "on_demand", gpus=4, price=11.0),))
    p = plan(make_input(pools=(cheap, azure), queues=queues, demand=(demand(gpus=2, count=2),), decision=order))
    assert [(x.pool, x.offering.instance_type) for x in p.launches] == [("aws", "p3.8xlarge")]
    # A 4-GPU task fits aws's machine exactly: the order decides again.
    assert launched(demand(gpus=4)) == [("aws", "p3.8xlarge")]
    # Only a capacity type the first pool's pick has: azure's spot is not compared
    # with aws's on-demand (the capacity choice is the pool's own, not overturned).
    azure_spot = pool("azure", offerings=(offering("NC12s", "spot", gpus=2, price=1.0),))
    p = plan(make_input(pools=(aws, azure_spot), queues=queues, demand=(demand(gpus=2),), decision=order))
    assert [x.pool for x in p.launches] == ["aws"]
