"""Step 3 taking runs of tasks in one step plans exactly what it planned one task at a time.

The oracle is `step3_before.plan_before`: the product's `plan()` with the former step 3
(one task per iteration: quota check, last bin, search or purchase, fair-share turn
check after each task). Any difference in launches (their order, offering, answers,
reasons), holds, drains, terminations or notes is a failure. Besides the random
snapshots of `snapshots.py`, `crowded_snapshots` draws large runs, many machines per
pool, spend headroom that runs out part way, quotas and close fair-share weights, so
the batched paths (a bin filled in one step, machines bought alike, a turn ending in
the middle of a run, a quota ending a run) are reached; `test_the_batched_paths_are_reached`
checks they are.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.planner import PlanInput, QueueView, plan
from autoscaler.planner.model import Launch
from autoscaler.policy.schema import Decision, TeamDecision
from tests.planner.builders import NOW, demand, make_input, offering, pool
from tests.planner.snapshots import TEAMS, snapshots
from tests.planner.step3_before import plan_before
from tests.planner.test_grouping_differential import sized_snapshots


@st.composite
def crowded_snapshots(draw: st.DrawFn) -> PlanInput:
    """Few shapes, many tasks: runs of tens of tasks into 1-8 GPU machines, pools of
    up to 40 machines, headroom for some of them, and quotas."""
    pools = tuple(
        pool(
            f"p{i}",
            offerings=tuple(
                offering(
                    f"g{gpus}",
                    ct=draw(st.sampled_from(["spot", "on_demand"])),
                    gpus=gpus,
                    price=draw(st.sampled_from([0.4, 1.0, 1.5, 3.5, 12.0])),
                    zone=draw(st.sampled_from(["z1", "z2"])),
                )
                for gpus in draw(st.lists(st.sampled_from([0, 1, 2, 3, 4, 8]), min_size=1, max_size=4, unique=True))
            ),
            max_instances=draw(st.integers(0, 40)),
        )
        for i in range(draw(st.integers(1, 3)))
    )
    groups = tuple(
        replace(
            demand(
                draw(st.sampled_from(TEAMS)),
                draw(st.integers(1, 60)),
                draw(st.sampled_from([0, 1, 1, 2, 3, 4, 8])),
                queue="gpu" if draw(st.integers(0, 4)) else "cpu",
                priority=draw(st.integers(0, 1)),
            ),
            oldest=NOW - timedelta(seconds=draw(st.sampled_from([10, 100, 1000]))),
        )
        for _ in range(draw(st.integers(1, 6)))
    )
    teams = {
        t: TeamDecision(
            spend_headroom_per_hour=draw(st.one_of(st.none(), st.floats(0, 40, allow_nan=False))),
            priority_weight=draw(st.sampled_from([1.0, 1.0, 2.0, 0.5, 3.0])),
            priority_tier=draw(st.sampled_from([0, 0, 1])),
            nominal_gpus=draw(st.one_of(st.none(), st.none(), st.integers(0, 40))),
            borrowing_limit_gpus=draw(st.one_of(st.none(), st.integers(0, 10))),
        )
        for t in draw(st.lists(st.sampled_from(TEAMS), unique=True))
    }
    names = tuple(p.name for p in pools)
    return make_input(
        pools=pools,
        queues=(QueueView("gpu", names), QueueView("cpu", tuple(reversed(names)))),
        demand=groups,
        decision=Decision(teams=teams),
        running_gpus={t: draw(st.integers(0, 30)) for t in TEAMS},
    )


SETTINGS = settings(max_examples=150, deadline=None)


@SETTINGS
@given(snapshots())
def test_random_snapshots_plan_as_before(inp: PlanInput) -> None:
    assert plan(inp) == plan_before(inp)


@SETTINGS
@given(sized_snapshots())
def test_cpu_and_memory_asks_plan_as_before(inp: PlanInput) -> None:
    assert plan(inp) == plan_before(inp)


@settings(max_examples=300, deadline=None)
@given(crowded_snapshots())
def test_crowded_snapshots_plan_as_before(inp: PlanInput) -> None:
    assert plan(inp) == plan_before(inp)


@pytest.mark.slow
@pytest.mark.timeout(1200)
@settings(max_examples=1500, deadline=None)
@given(crowded_snapshots())
def test_many_more_crowded_snapshots_plan_as_before(inp: PlanInput) -> None:
    assert plan(inp) == plan_before(inp)


def test_machines_bought_alike_are_one_launch_object() -> None:
    """40 one-GPU tasks on 4-GPU machines: ten full machines, one `Launch` ten times."""
    cloud = pool(offerings=(offering("g.4", gpus=4, price=1.0),), max_instances=20)
    p = plan(make_input(pools=(cloud,), demand=(demand("vision", 40, 1),)))
    assert len(p.launches) == 10 and len({id(x) for x in p.launches}) == 1
    assert p.launches[0].answers == (("gpu", 1, 4),)
    assert p == plan_before(make_input(pools=(cloud,), demand=(demand("vision", 40, 1),)))


def test_the_batched_paths_are_reached() -> None:
    """A differential test proves nothing about paths its inputs never take: the
    crowded snapshots must end turns part way through runs, buy machines alike, stop
    a run at the quota and at the headroom, and leave a machine open after a run."""
    reached: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(crowded_snapshots())
    def probe(inp: PlanInput) -> None:
        p = plan(inp)
        launches: list[Launch] = list(p.launches)
        teams_in_order = [x.team for x in launches]
        switches = sum(1 for a, b in itertools.pairwise(teams_in_order) if a != b)
        alike = any(a is b for a, b in itertools.pairwise(launches))
        reached.update(
            name
            for name, hit in (
                ("alike", alike),
                ("turns interleave", switches > len({*teams_in_order})),
                ("quota hold", any(h.reason.startswith("quota") for h in p.holds)),
                ("headroom hold", any(h.reason.startswith("spend headroom") for h in p.holds)),
                ("pool max hold", any("at its max" in h.reason for h in p.holds)),
                ("open bin shared", any(len(x.answers) > 1 for x in launches)),
                ("partly filled", any(x.tasks * max(x.answers[0][1], 1) < max(x.gpus, 1) for x in launches)),
            )
            if hit
        )

    probe()
    assert reached == {
        "alike",
        "turns interleave",
        "quota hold",
        "headroom hold",
        "pool max hold",
        "open bin shared",
        "partly filled",
    }


def test_the_oracle_is_the_former_step() -> None:
    """The oracle must not be the product's step 3: it makes one Launch per machine."""
    cloud = pool(offerings=(offering("g.4", gpus=4, price=1.0),), max_instances=20)
    inp = make_input(pools=(cloud,), demand=(demand("vision", 8, 1),))
    before = plan_before(inp).launches
    assert len(before) == 2 and before[0] is not before[1]
    assert replace(before[0]) == before[1]
