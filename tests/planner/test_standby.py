"""Standby machines: spot machines kept booted for checkpointing work a reclaim requeues.

Hand cases of the count (the smallest S with P(Poisson(rate x boot) >= S) <= 5 %), the
plan's step 3b (free capacity counts first and is kept from scale-down; the rest is
launched as spot, after queued work, through the team's quota, headroom and placement
and the pool's max), and a property over random fleets and exposures that no standby
launch breaks a pool max or a quota and none is ever bought beyond what is wanted.
"""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.admission.right_size import Size
from autoscaler.planner import plan
from autoscaler.planner.model import PlanInput
from autoscaler.planner.standby import MAX_STANDBY, Exposure, Shape, Standby, miss_chance, standby_count
from autoscaler.policy.schema import Decision, TeamDecision
from tests.planner.builders import decision, demand, instance, make_input, offering, pool, worker

BOOT_H = 0.05  # 3 minutes


def _poisson_at_least(mean: float, s: int) -> float:
    return 1.0 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(s))


def test_count_is_the_fewest_machines_a_reclaim_finds_none_of_with_at_most_one_percent() -> None:
    assert standby_count(0.0, BOOT_H) == 0
    # 0.2 reclaims/h against a 3 min boot: mean 0.01 booting, P(N >= 1) = 0.995 %: one.
    assert standby_count(0.2, BOOT_H) == 1
    # 0.21/h: P(N >= 1) = 1.045 % is over 1 %, P(N >= 2) = 0.005 %: two.
    assert standby_count(0.21, BOOT_H) == 2
    # 1/h: mean 0.05, P(N >= 1) = 4.9 %, P(N >= 2) = 1 - e^-0.05 x 1.05 = 0.12 %: two.
    assert standby_count(1.0, BOOT_H) == 2
    # 6/h: mean 0.3, P(N >= 2) = 3.7 %, P(N >= 3) = 1 - e^-0.3 x 1.345 = 0.36 %: three.
    assert standby_count(6.0, BOOT_H) == 3
    assert standby_count(10_000.0, BOOT_H) == MAX_STANDBY
    # Another miss chance: 6/h at 5 % is two (P(N >= 2) = 3.7 %).
    assert standby_count(6.0, BOOT_H, miss=0.05) == 2
    for rate in (0.2, 0.5, 1.0, 6.0, 7.2, 40.0):
        s = standby_count(rate, BOOT_H)
        assert math.isclose(miss_chance(rate, BOOT_H, s), _poisson_at_least(rate * BOOT_H, s), abs_tol=1e-12)
        if s < MAX_STANDBY:
            assert miss_chance(rate, BOOT_H, s) <= 0.01 < miss_chance(rate, BOOT_H, s - 1)


VISION_1 = Shape("vision", "gpu", 1)


def _with(
    inp: PlanInput, rate: float = 1.0, tasks: int = 40, shape: Shape = VISION_1, *, shared: bool = False
) -> PlanInput:
    return replace(inp, standby=Standby({shape: Exposure(tasks, rate, 300.0)}, BOOT_H, shared=shared))


def _teams(*teams: str, rate: float = 0.1, miss: float = 0.05, shared: bool = True) -> Standby:
    """One long checkpointing 1-GPU task per team, each reclaimed at `rate`."""
    return Standby({Shape(t, "gpu", 1): Exposure(1, rate, 300.0, miss) for t in teams}, BOOT_H, shared=shared)


EIGHT = tuple(f"team{i}" for i in range(8))


def _spot_pool(**kw: object) -> object:
    return pool(
        offerings=(offering(ct="spot", price=0.4), offering(ct="on_demand", price=1.0), offering("g.4", gpus=4)),
        **kw,
    )


def test_standby_machines_are_launched_as_spot_with_the_numbers_and_answer_no_task() -> None:
    p = plan(_with(make_input(pools=(pool(),))))
    assert len(p.launches) == 2
    for launch in p.launches:
        assert launch.team == "vision" and launch.answers == ()
        assert launch.offering.capacity_type == "spot" and launch.offering.gpus == 1
        assert launch.reason.startswith(
            "standby for team vision: 40 checkpointing task(s) of 1 GPU(s) in gpu run on spot, reclaimed about "
            "once every 60 min in all; with 2 machine(s) standing by against a 3 min boot, a reclaimed task waits "
            "for a boot with chance 0.1%"
        )
    assert not p.holds and not p.notes


def test_idle_and_booting_capacity_counts_first_and_is_kept_from_scale_down() -> None:
    inp = make_input(
        pools=(pool(idle_timeout_s=60),),
        workers=(worker("w-idle", idle_s=3600, instance_id="i-idle"),),
        instances=(
            instance("i-idle", worker_id="w-idle", worker_state="idle"),
            instance("i-boot", state="booting"),
        ),
    )
    without = plan(inp)
    assert [d.worker_id for d in without.drains] == ["w-idle"]  # past its idle timeout
    p = plan(_with(inp))
    assert p.launches == () and p.drains == ()
    # A third wanted (7.2/h) is the only one bought.
    p3 = plan(_with(inp, rate=7.2))
    assert len(p3.launches) == 1 and p3.drains == ()


def test_queued_work_goes_first_a_full_pool_buys_no_standby_and_says_so() -> None:
    inp = make_input(pools=(pool(max_instances=1),), demand=(demand(),))
    p = plan(_with(inp))
    assert [len(launch.answers) for launch in p.launches] == [1]  # the queued task's machine
    assert len(p.notes) == 1
    assert p.notes[0].endswith("; only 0 stand by: pool cloud at its max of 1 instances")


def test_an_idle_machine_step_2_gives_a_queued_task_is_not_counted_as_standby() -> None:
    inp = make_input(
        pools=(pool(),),
        demand=(demand(),),
        workers=(worker("w-idle", idle_s=10, instance_id="i-idle"),),
        instances=(instance("i-idle", worker_id="w-idle", worker_state="idle"),),
    )
    p = plan(_with(inp))
    assert p.placed_on_existing == 1
    assert len(p.launches) == 2 and all(launch.answers == () for launch in p.launches)


def test_quota_headroom_and_a_frozen_team_hold_standby_back() -> None:
    quota = decision(vision=TeamDecision(nominal_gpus=4))
    full = replace(make_input(pools=(pool(),), decision=quota), running_gpus={"vision": 3})
    p = plan(_with(full))
    assert len(p.launches) == 1  # 3 running + 1 standby GPU = the quota of 4
    assert p.notes[0].endswith(
        "; only 1 stand by: quota: team vision holds or is planned 4 GPU(s) of nominal 4; 0 more may start now, a task needs 1"
    )
    poor = decision(vision=TeamDecision(spend_headroom_per_hour=0.5))
    p = plan(_with(make_input(pools=(pool(),), decision=poor)))
    assert len(p.launches) == 1  # one 0.40 USD/h spot machine fits 0.50 USD/h
    assert "spend headroom: 0.10 USD/h left for team vision" in p.notes[0]
    frozen = decision(vision=TeamDecision(may_scale_up=False))
    assert plan(_with(make_input(pools=(pool(),), decision=frozen))).launches == ()
    assert plan(_with(make_input(pools=(pool(),), decision=Decision.failed("boom")))).launches == ()


def test_a_team_allowed_only_on_demand_gets_no_standby() -> None:
    od_only = decision(vision=TeamDecision(allowed_capacity_types=["on_demand"]))
    p = plan(_with(make_input(pools=(pool(),), decision=od_only)))
    assert p.launches == ()
    assert "only 0 stand by" in p.notes[0]


def test_a_standby_on_a_team_pool_is_the_teams_and_right_sized() -> None:
    pools = (pool(offerings=(offering(ct="spot", price=0.4), offering("g.4", gpus=4, price=1.2))),)
    four = instance("i-4", gpus=4, worker_id="w-4", worker_state="idle")
    workers = (worker("w-4", gpus=4, idle_s=10, instance_id="i-4"),)
    # An idle 4-GPU machine takes two 1-GPU tasks at once: it is both standby machines.
    assert plan(_with(make_input(pools=pools, workers=workers, instances=(four,)))).launches == ()
    # Unless it holds 1-GPU work back for the pool's 1-GPU machines (admission.right_size),
    # as the lease would: then it is no standby for such work.
    held_back = replace(four, smaller=(Size(1, 8, 61_440),))
    p = plan(_with(make_input(pools=pools, workers=workers, instances=(held_back,))))
    assert [launch.offering.instance_type for launch in p.launches] == ["g.1", "g.1"]
    # Another team's idle machine on a team pool is not this team's standby.
    other = make_input(
        pools=(pool(tenancy="team"),),
        workers=(worker("w-x", idle_s=10, instance_id="i-x"),),
        instances=(instance("i-x", team="nlp", worker_id="w-x", worker_state="idle"),),
    )
    assert len(plan(_with(other)).launches) == 2


def test_pooled_merges_the_shapes_of_teams_with_one_placement() -> None:
    rule = Standby(
        {
            Shape("a", "gpu", 1): Exposure(2, 0.5, 10.0, 0.03),
            Shape("b", "gpu", 1): Exposure(1, 0.2, None, 0.02),
            Shape("c", "gpu", 1): Exposure(1, 0.3, 40.0, 0.05),
            Shape("a", "gpu", 2): Exposure(1, 0.1, 5.0, 0.05),
            Shape("frozen", "gpu", 1): Exposure(9, 9.0, 1.0, 0.01),
        },
        BOOT_H,
        shared=True,
    )
    pooled = rule.pooled({"a": None, "b": None, "c": ("p1",)}).exposure
    assert pooled == {
        Shape("shared", "gpu", 1): Exposure(3, 0.7, 10.0, 0.02, ("a", "b")),
        Shape("shared", "gpu", 1, pools=("p1",)): Exposure(1, 0.3, 40.0, 0.05, ("c",)),
        Shape("shared", "gpu", 2): Exposure(1, 0.1, 5.0, 0.05, ("a",)),
    }


def test_shared_standby_is_launched_for_no_team_and_pools_the_teams_need() -> None:
    inp = make_input(pools=(pool(),))
    # Eight teams, each one task reclaimed at 0.1/h that keeps its target at 5 % misses:
    # one machine each alone; shared, 0.8/h misses 3.9 % with one machine for all.
    own = plan(replace(inp, standby=_teams(*EIGHT, shared=False)))
    assert sorted(launch.team for launch in own.launches) == sorted(EIGHT)
    p = plan(replace(inp, standby=_teams(*EIGHT)))
    (launch,) = p.launches
    assert launch.team == "shared" and launch.offering.capacity_type == "spot" and launch.answers == ()
    assert launch.reason.startswith(
        "standby for teams team0, team1, team2, team3, team4, team5, team6, team7 (shared): 8 checkpointing "
        "task(s) of 1 GPU(s) in gpu run on spot, reclaimed about once every 75 min in all; with 1 machine(s) "
        "standing by against a 3 min boot, a reclaimed task waits for a boot with chance 3.9%"
    )
    assert launch.offering.gpus == 1


def test_shared_standby_counts_only_capacity_every_team_may_use() -> None:
    def idle(team: str | None) -> PlanInput:
        return make_input(
            pools=(pool(tenancy="team", idle_timeout_s=60),),
            workers=(worker("w-x", idle_s=3600, instance_id="i-x"),),
            instances=(instance("i-x", team=team, worker_id="w-x", worker_state="idle"),),
        )

    # vision's idle machine on a team pool is no standby for nlp: one is launched, and
    # vision's machine is drained past its idle timeout as without standby.
    p = plan(replace(idle("vision"), standby=_teams("vision", "nlp")))
    assert [launch.team for launch in p.launches] == ["shared"]
    assert [d.worker_id for d in p.drains] == ["w-x"]
    # A machine launched for no team (a pool minimum, a shared standby) is either's:
    # it stands by, kept from the drain.
    p = plan(replace(idle("shared"), standby=_teams("vision", "nlp")))
    assert p.launches == () and p.drains == ()


def test_a_frozen_team_one_without_headroom_or_spot_or_another_placement_is_not_pooled() -> None:
    inp = make_input(pools=(pool(),), decision=decision(team0=TeamDecision(may_scale_up=False)))
    (launch,) = plan(replace(inp, standby=_teams(*EIGHT))).launches
    assert "teams team1, team2, team3, team4, team5, team6, team7 (shared): 7 checkpointing" in launch.reason
    broke = make_input(pools=(pool(),), decision=decision(team0=TeamDecision(spend_headroom_per_hour=0.0)))
    (launch,) = plan(replace(broke, standby=_teams(*EIGHT))).launches
    assert "teams team1, team2, team3, team4, team5, team6, team7 (shared): 7 checkpointing" in launch.reason
    od_only = make_input(pools=(pool(),), decision=decision(team0=TeamDecision(allowed_capacity_types=["on_demand"])))
    (launch,) = plan(replace(od_only, standby=_teams(*EIGHT))).launches
    assert "teams team1, team2, team3, team4, team5, team6, team7 (shared): 7 checkpointing" in launch.reason
    apart = make_input(pools=(pool(),), decision=decision(team0=TeamDecision(allowed_pools=["cloud"])))
    reasons = sorted(launch.reason for launch in plan(replace(apart, standby=_teams(*EIGHT))).launches)
    assert len(reasons) == 2
    assert reasons[0].startswith("standby for teams team0 (shared): 1 checkpointing")
    assert reasons[1].startswith("standby for teams team1, team2, team3, team4, team5, team6, team7 (shared)")
    assert plan(replace(inp, standby=_teams(*EIGHT), decision=Decision.failed("boom"))).launches == ()


@settings(max_examples=150, deadline=None)
@given(
    rate=st.floats(0.0, 80.0),
    idle=st.integers(0, 4),
    booting=st.integers(0, 3),
    queued=st.integers(0, 4),
    max_instances=st.integers(0, 8),
    nominal=st.one_of(st.none(), st.integers(0, 10)),
    running=st.integers(0, 6),
    shared=st.booleans(),
)
def test_standby_never_breaks_a_pool_max_or_a_quota_nor_buys_beyond_what_is_wanted(
    rate: float,
    idle: int,
    booting: int,
    queued: int,
    max_instances: int,
    nominal: int | None,
    running: int,
    shared: bool,
) -> None:
    dec = decision(vision=TeamDecision(nominal_gpus=nominal)) if nominal is not None else Decision()
    workers = tuple(worker(f"w{i}", idle_s=30 * i, instance_id=f"i{i}") for i in range(idle))
    instances = tuple(instance(f"i{i}", worker_id=f"w{i}", worker_state="idle") for i in range(idle)) + tuple(
        instance(f"b{i}", state="booting") for i in range(booting)
    )
    base = make_input(
        pools=(pool(max_instances=max_instances),),
        demand=(demand(count=queued),) if queued else (),
        workers=workers,
        instances=instances,
        decision=dec,
        running_gpus={"vision": running},
    )
    inp = _with(base, rate=rate, shared=shared)
    p = plan(inp)
    without = plan(base)
    standby = [launch for launch in p.launches if launch.answers == ()]
    # Queued work is placed, launched for and held exactly as without standby.
    assert [launch for launch in p.launches if launch.answers] == list(without.launches)
    assert (p.placed_on_existing, p.holds) == (without.placed_on_existing, without.holds)
    launched_for = "shared" if shared else "vision"
    assert all(launch.offering.capacity_type == "spot" and launch.team == launched_for for launch in standby)
    assert len(instances) + len(p.launches) <= max(max_instances, len(instances))
    assert len(standby) <= standby_count(rate, BOOT_H)
    # A shared standby is no team's GPUs until a task takes it (the lease gate asks the
    # quota then); a team's own counts against its quota now.
    if nominal is not None and not shared:
        planned = sum(len(launch.answers) for launch in p.launches) + p.placed_on_existing
        assert running + planned + len(standby) <= max(nominal, running + planned)
    # Free capacity kept for standby is never drained; nothing else changes in step 4.
    assert {d.worker_id for d in p.drains} <= {d.worker_id for d in without.drains}
