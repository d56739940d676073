"""The capacity choice inside `plan()`: one call site ranks a pool's offerings by the
task's expected cost; the launch reason carries the numbers; the policy's allowed
capacity types are never left."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.planner import DemandGroup, plan
from autoscaler.planner.capacity_choice import CapacityModel
from autoscaler.policy.schema import Decision, TeamDecision
from tests.planner.builders import NOW, make_input, offering, pool

# The simulator's V100: 3.06 USD/h on-demand, 0.918 spot, reclaimed at 0.24/h.
V100 = (
    offering("p3.2xlarge", "spot", price=0.918, zone="a"),
    offering("p3.2xlarge", "on_demand", price=3.06, zone="a"),
)
MODEL = CapacityModel(prior_rate=0.24, boot_h=0.05)


def _task(runtime_h: float | None, checkpoints: str | None = None, **kw: object) -> DemandGroup:
    return dataclasses.replace(
        DemandGroup("gpu", "vision", 1, None, 0, 1, NOW), runtime_h=runtime_h, checkpoints=checkpoints, **kw
    )


def _launch(task: DemandGroup, capacity: CapacityModel | None = MODEL, offerings=V100, decision=None):
    inp = make_input(pools=(pool(offerings=offerings),), demand=(task,), decision=decision)
    p = plan(dataclasses.replace(inp, capacity=capacity))
    assert len(p.launches) == 1, p
    return p.launches[0]


def test_a_short_task_goes_on_spot_and_the_reason_says_why() -> None:
    launch = _launch(_task(1.0))
    assert launch.offering.capacity_type == "spot"
    assert "capacity: spot: expected spot" in launch.reason and "on-demand 3.2" in launch.reason


def test_a_30_hour_task_that_restarts_from_zero_goes_on_demand() -> None:
    launch = _launch(_task(30.0))
    assert launch.offering.capacity_type == "on_demand"
    assert "capacity: on-demand: expected on-demand 91.95 USD" in launch.reason


def test_a_30_hour_task_that_checkpoints_goes_on_spot() -> None:
    assert _launch(_task(30.0, "on-signal")).offering.capacity_type == "spot"
    assert _launch(_task(30.0, "every:30")).offering.capacity_type == "spot"


def test_without_the_model_the_pool_order_decides_as_before() -> None:
    launch = _launch(_task(30.0), capacity=None)
    assert launch.offering.capacity_type == "spot" and "capacity:" not in launch.reason


def test_a_spot_only_team_stays_on_spot_whatever_the_cost() -> None:
    decision = Decision(teams={"vision": TeamDecision(allowed_capacity_types=["spot"])})
    assert _launch(_task(30.0), decision=decision).offering.capacity_type == "spot"


def test_the_zone_with_the_lower_observed_rate_wins_at_equal_price() -> None:
    stormy, calm = (
        offering("p3.2xlarge", "spot", price=0.918, zone="a"),
        offering("p3.2xlarge", "spot", price=0.918, zone="b"),
    )
    model = dataclasses.replace(MODEL, reclaim_rates={stormy.key: 0.6, calm.key: 0.05})
    launch = _launch(_task(3.0), capacity=model, offerings=(stormy, calm, V100[1]))
    assert launch.offering.zone == "b"


def test_after_a_reclaim_a_task_that_restarts_from_zero_goes_on_demand_first() -> None:
    assert _launch(_task(1.0, after_reclaim=True)).offering.capacity_type == "on_demand"
    # ...while one that checkpoints is left to the model (spot is still cheaper).
    assert _launch(_task(1.0, "on-signal", after_reclaim=True)).offering.capacity_type == "spot"


def test_a_checkpointing_task_reclaimed_again_and_again_goes_on_demand_at_its_wait_target() -> None:
    # 30 min target, 3 min boots: the first boot and 9 reclaims fit. A 1 h on-signal
    # task (0.24 reclaims expected) stays on spot after 8 reclaims (one more allowed,
    # P(N > 1) = 1 - e^-0.243 (1.243) = 2.5 %) and goes on-demand after 9 (none left).
    model = dataclasses.replace(MODEL, wait_target_h=0.5)
    eight = _launch(_task(1.0, "on-signal", after_reclaim=True, reclaims_so_far=8), capacity=model)
    assert eight.offering.capacity_type == "spot"
    nine = _launch(_task(1.0, "on-signal", after_reclaim=True, reclaims_so_far=9), capacity=model)
    assert nine.offering.capacity_type == "on_demand"
    assert "would pass the wait target of 30 min" in nine.reason and "after 9 so far" in nine.reason
    # Without a target the count changes nothing.
    assert _launch(_task(1.0, "on-signal", reclaims_so_far=50)).offering.capacity_type == "spot"


def test_within_spot_a_zone_that_keeps_the_wait_target_goes_first() -> None:
    # 30 h on-signal: at 0.24/h it misses the target (P = 20 %), at 0.05/h it keeps it
    # (P = 4e-6), though that zone's machine is dearer (1.00 against 0.918 USD/h).
    stormy = offering("p3.2xlarge", "spot", price=0.918, zone="a")
    calm = offering("p3.2xlarge", "spot", price=1.0, zone="b")
    model = dataclasses.replace(MODEL, wait_target_h=0.5, reclaim_rates={stormy.key: 0.24, calm.key: 0.05})
    launch = _launch(_task(30.0, "on-signal"), capacity=model, offerings=(stormy, calm, V100[1]))
    assert launch.offering.capacity_type == "spot" and launch.offering.zone == "b"


@settings(max_examples=60, deadline=None)
@given(
    runtime=st.none() | st.floats(0.01, 200.0),
    checkpoints=st.sampled_from([None, "on-signal", "every:15", "every:600"]),
    allowed=st.sampled_from([["spot"], ["on_demand"], ["spot", "on_demand"]]),
    rate=st.floats(0.0, 3.0),
    spot_price=st.floats(0.01, 10.0),
)
def test_the_plan_never_launches_a_capacity_type_the_policy_does_not_allow(
    runtime: float | None, checkpoints: str | None, allowed: list[str], rate: float, spot_price: float
) -> None:
    offerings = (offering("g", "spot", price=spot_price), offering("g", "on_demand", price=1.0))
    decision = Decision(teams={"vision": TeamDecision(allowed_capacity_types=allowed)})
    model = dataclasses.replace(MODEL, prior_rate=rate)
    inp = make_input(pools=(pool(offerings=offerings),), demand=(_task(runtime, checkpoints),), decision=decision)
    p = plan(dataclasses.replace(inp, capacity=model))
    assert len(p.launches) == 1
    assert p.launches[0].offering.capacity_type in allowed


def test_a_zone_with_only_the_prior_is_tried_by_a_checkpointing_task_and_the_reason_says_so() -> None:
    # Zone a has evidence (0.16/h, optimistic 0.147), zone b none: the prior 0.24/h worth
    # 20 h, optimistic 0.1305 (tests/planner/test_capacity_choice.py has the numbers).
    tried, untried = (
        offering("p3.2xlarge", "spot", price=0.918, zone="a"),
        offering("p3.2xlarge", "spot", price=0.918, zone="b"),
    )
    model = dataclasses.replace(
        MODEL, reclaim_rates={tried.key: 0.16}, optimistic_rates={tried.key: 0.147}, prior_optimistic_rate=0.1305
    )
    launch = _launch(_task(30.0, "on-signal"), capacity=model, offerings=(tried, untried, V100[1]))
    assert launch.offering.zone == "b"
    assert f"trying {untried.key}" in launch.reason
    # A long task that restarts from zero stays where the evidence is (b is 33 % dearer there).
    assert _launch(_task(6.0), capacity=model, offerings=(tried, untried, V100[1])).offering.zone == "a"
