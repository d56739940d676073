"""Gangs and single tasks in one order: a single task of a higher priority than a gang
is planned before it (existing machines first, then new ones), so it never waits behind
a low-priority gang for the same capacity; at one priority the gang goes first, and a
gang is still planned as one unit (all its missing machines or none).

The property draws mixes of 2-GPU single tasks and gangs of 2-GPU ranks, with random
priorities, on one pool with a few idle machines and a small max, and checks that a
single task is only ever held for room while no gang it outranks got any of it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.planner import DemandGroup, plan
from tests.planner.builders import NOW, demand, make_input, offering, pool, worker

TWO_GPU = (offering("g.2", ct="on_demand", gpus=2, price=2.0),)


def gang(gid: str, nodes: int = 2, priority: int = 0) -> DemandGroup:
    return DemandGroup("gpu", "vision", 2, None, priority, 1, NOW, gang=gid, nodes=nodes)


def test_a_higher_priority_task_takes_an_idle_machine_before_a_low_priority_gang() -> None:
    idle = (worker("w1", gpus=2), worker("w2", gpus=2))
    p = plan(
        make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang("g1"), demand(gpus=2, priority=10)), workers=idle)
    )
    # The single task is on an idle machine; the gang counts the other and launches one.
    assert [(x.nodes, x.gang) for x in p.launches] == [(1, "g1")]
    assert p.placed_on_existing == 2


def test_a_higher_priority_task_gets_the_pool_room_a_low_priority_gang_would_take() -> None:
    full = pool(offerings=TWO_GPU, max_instances=2)
    p = plan(make_input(pools=(full,), demand=(gang("g1"), demand(gpus=2, priority=10))))
    assert [(x.nodes, x.gang) for x in p.launches] == [(1, None)]
    (hold,) = p.holds
    assert "gang of 2" in hold.reason  # held whole: never half of it launched


def test_at_one_priority_the_gang_goes_first() -> None:
    full = pool(offerings=TWO_GPU, max_instances=2)
    p = plan(make_input(pools=(full,), demand=(gang("g1"), demand(gpus=2))))
    assert [(x.nodes, x.gang) for x in p.launches] == [(2, "g1")]


def test_a_high_priority_gang_still_goes_before_low_priority_tasks() -> None:
    full = pool(offerings=TWO_GPU, max_instances=2)
    p = plan(make_input(pools=(full,), demand=(gang("g1", priority=10), demand(gpus=2, count=2))))
    assert [(x.nodes, x.gang) for x in p.launches] == [(2, "g1")]


@settings(max_examples=80, deadline=None)
@given(
    singles=st.integers(0, 5),
    single_priority=st.integers(0, 3),
    gang_priorities=st.lists(st.integers(0, 3), min_size=1, max_size=3),
    idle=st.integers(0, 3),
    max_instances=st.integers(2, 7),
)
def test_no_single_task_waits_for_room_a_gang_it_outranks_got(
    singles: int, single_priority: int, gang_priorities: list[int], idle: int, max_instances: int
) -> None:
    # Gang i has i + 2 ranks, so its hold ("gang of N: ...") names it.
    gangs = [(prio, i + 2) for i, prio in enumerate(gang_priorities)]
    groups = [demand(gpus=2, priority=single_priority, count=singles)] if singles else []
    groups += [gang(f"g{nodes}", nodes=nodes, priority=prio) for prio, nodes in gangs]
    workers = tuple(worker(f"w{i}", gpus=2) for i in range(idle))
    p = plan(
        make_input(pools=(pool(offerings=TWO_GPU, max_instances=max_instances),), demand=tuple(groups), workers=workers)
    )
    held_tasks = sum(h.tasks for h in p.holds if "gang of" not in h.reason)
    held = {nodes for _prio, nodes in gangs if any(h.reason.startswith(f"gang of {nodes}:") for h in p.holds)}
    launched = {x.gang: x.nodes for x in p.launches if x.gang is not None}
    for _prio, nodes in gangs:
        # One unit: held whole, or launched no more than it has ranks.
        assert not (nodes in held and f"g{nodes}" in launched)
        assert launched.get(f"g{nodes}", 0) <= nodes
    if held_tasks:
        # A single task waits for room: every gang it outranks got none (no launch, no
        # idle machine: held).
        for prio, nodes in gangs:
            if prio < single_priority:
                assert nodes in held, (gangs, p)
