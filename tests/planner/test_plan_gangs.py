"""Planning gangs as units: a queued multi-node task is N machines of its shape in ONE
pool, one rank per machine, its quota and spend asked for whole; idle machines that
fit count toward the N and only the missing ones are launched, as one gang launch.

Each test tries to break one of those promises: two ranks counted on one machine, a
half gang launched where the pool has room for part of it, a busy machine counted,
the quota or the headroom asked per rank, the idle machines given to single tasks as
well, a driver that cannot launch gangs sent one."""

from __future__ import annotations

from autoscaler.planner import DemandGroup, plan
from autoscaler.policy.schema import TeamDecision
from tests.planner.builders import NOW, decision, demand, make_input, offering, pool, worker


def gang(gid: str = "g1", nodes: int = 2, gpus: int = 2, reserved: int = 0, team: str = "vision") -> DemandGroup:
    return DemandGroup("gpu", team, gpus, None, 0, 1, NOW, gang=gid, nodes=nodes, reserved=reserved)


TWO_GPU = (offering("g.2", ct="on_demand", gpus=2, price=2.0),)


def test_a_gang_is_one_launch_of_its_nodes_in_one_pool() -> None:
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(),)))
    (launch,) = p.launches
    assert (launch.nodes, launch.gang, launch.pool, launch.offering.gpus) == (2, "g1", "cloud", 2)
    assert launch.hourly_price == 4.0
    assert p.holds == ()


def test_idle_machines_that_fit_count_and_only_the_missing_are_launched() -> None:
    idle = worker("w1", gpus=2)
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(nodes=3),), workers=(idle,)))
    (launch,) = p.launches
    assert launch.nodes == 2 and p.placed_on_existing == 1


def test_a_machine_with_room_for_two_ranks_counts_for_one() -> None:
    # 1 GPU per rank on 2-GPU machines: the lease puts one rank per machine.
    idle = worker("w1", gpus=2)
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(gpus=1),), workers=(idle,)))
    (launch,) = p.launches
    assert launch.nodes == 1 and p.placed_on_existing == 1


def test_a_busy_machine_with_free_gpus_does_not_count() -> None:
    busy = worker("w1", gpus=4, used=1, state="busy")
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(),), workers=(busy,)))
    assert [x.nodes for x in p.launches] == [2] and p.placed_on_existing == 0


def test_ranks_already_reserved_are_not_wanted_again() -> None:
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(nodes=3, reserved=2),)))
    assert [x.nodes for x in p.launches] == [1]


def test_enough_idle_machines_launch_nothing_and_single_tasks_do_not_count_on_them() -> None:
    idle = (worker("w1", gpus=2), worker("w2", gpus=2))
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(), demand(gpus=2)), workers=idle))
    # The gang takes both idle machines; the single 2-GPU task needs a machine of its own.
    assert [(x.nodes, x.gang) for x in p.launches] == [(1, None)]
    assert p.placed_on_existing == 2


def test_no_half_gang_where_the_pool_has_room_for_part_of_it() -> None:
    small = pool("small", offerings=TWO_GPU, max_instances=1)
    p = plan(make_input(pools=(small,), demand=(gang(),)))
    assert p.launches == ()
    (hold,) = p.holds
    assert "room for 1" in hold.reason and "needs 2" in hold.reason and hold.tasks == 1


def test_the_next_pool_takes_the_whole_gang_when_the_first_cannot() -> None:
    small = pool("small", offerings=TWO_GPU, max_instances=1)
    big = pool("big", offerings=(offering("g.2b", ct="on_demand", gpus=2, price=3.0),))
    p = plan(make_input(pools=(small, big), demand=(gang(),)))
    assert [(x.pool, x.nodes) for x in p.launches] == [("big", 2)]


def test_the_quota_is_asked_for_the_whole_gang() -> None:
    d = decision(vision=TeamDecision(nominal_gpus=3, borrowing_limit_gpus=0))
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(),), decision=d))
    assert p.launches == ()
    assert "quota" in p.holds[0].reason and "2 x 2" in p.holds[0].reason


def test_the_headroom_is_asked_for_every_machine_launched() -> None:
    d = decision(vision=TeamDecision(spend_headroom_per_hour=3.0))  # one machine's price (2.0), not two
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(),), decision=d))
    assert p.launches == ()
    assert "headroom" in p.holds[0].reason


def test_a_frozen_team_launches_no_gang() -> None:
    d = decision(vision=TeamDecision(may_scale_up=False))
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(),), decision=d))
    assert p.launches == () and "may not scale up" in p.holds[0].reason


def test_a_driver_without_gang_launches_gets_one_machine_per_launch() -> None:
    one_by_one = pool(offerings=TWO_GPU, max_gang_nodes=1)
    p = plan(make_input(pools=(one_by_one,), demand=(gang(nodes=3),)))
    assert [(x.nodes, x.gang) for x in p.launches] == [(1, None)] * 3


def test_two_gangs_do_not_count_on_the_same_idle_machine() -> None:
    idle = (worker("w1", gpus=2),)
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang("a"), gang("b")), workers=idle))
    assert sorted((x.gang, x.nodes) for x in p.launches) == [("a", 1), ("b", 2)]


def test_a_gang_is_held_where_no_machine_fits_a_rank() -> None:
    p = plan(make_input(pools=(pool(offerings=TWO_GPU),), demand=(gang(gpus=4),)))
    assert p.launches == () and "no instance type with 4 GPU(s)" in p.holds[0].reason
