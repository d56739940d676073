"""The planner applies the same admission as the lease: quota over running plus
planned GPUs, no placement of a frozen team on capacity it does not pay for, CPU and
memory fit when choosing shapes, and a failed policy launches nothing."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.planner import DemandGroup, plan
from autoscaler.planner.model import OfferingView
from autoscaler.policy.schema import Decision, TeamDecision
from tests.planner.builders import NOW, decision, demand, instance, make_input, offering, pool, worker


def launched_gpus(p, team: str) -> int:
    return sum(sum(g for _, g in launch.answers) for launch in p.launches if launch.team == team)


def test_sixty_tasks_under_a_sixteen_gpu_quota_launch_sixteen() -> None:
    inp = make_input(
        pools=(pool(max_instances=100),),
        demand=(demand("research", count=60),),
        decision=decision(research=TeamDecision(nominal_gpus=16, borrowing_limit_gpus=0)),
    )
    p = plan(inp)
    assert launched_gpus(p, "research") == 16
    held = [h for h in p.holds if h.team == "research"]
    assert sum(h.tasks for h in held) == 44 and all(h.reason.startswith("quota:") for h in held)


def test_quota_counts_running_and_existing_capacity() -> None:
    inp = make_input(
        pools=(pool(max_instances=100),),
        demand=(demand("research", count=10),),
        workers=tuple(worker(f"w{i}", instance_id=f"i{i}") for i in range(3)),
        instances=tuple(instance(f"i{i}", team="research", worker_id=f"w{i}", worker_state="idle") for i in range(3)),
        running_gpus={"research": 12},
        decision=decision(research=TeamDecision(nominal_gpus=16, borrowing_limit_gpus=0)),
    )
    p = plan(inp)
    assert p.placed_on_existing + launched_gpus(p, "research") == 4


def test_frozen_team_is_not_placed_on_another_teams_idle_machine() -> None:
    inp = make_input(
        demand=(demand("vision", count=1),),
        workers=(worker("w1", instance_id="i1"),),
        instances=(instance("i1", team="nlp", worker_id="w1", worker_state="idle"),),
        decision=decision(vision=TeamDecision(may_scale_up=False, spend_headroom_per_hour=0.0)),
    )
    p = plan(inp)
    assert p.placed_on_existing == 0 and not p.launches
    assert p.holds and p.holds[0].team == "vision"


def test_cpus_and_memory_choose_the_shape() -> None:
    small = OfferingView("s.1", "spot", "z1", 1, "A10G", 0.5, 2, 4000)
    big = OfferingView("b.1", "spot", "z1", 1, "A10G", 2.0, 64, 512000)
    inp = make_input(
        pools=(pool(offerings=(small, big)),),
        demand=(DemandGroup("gpu", "vision", 1, None, 0, 1, NOW, False, 32.0, 200000),),
    )
    p = plan(inp)
    assert [launch.offering.instance_type for launch in p.launches] == ["b.1"]
    # Two such tasks do not share one 64-CPU machine's 512 GB if they need 300 GB each.
    inp2 = replace(inp, demand=(DemandGroup("gpu", "vision", 1, None, 0, 2, NOW, False, 8.0, 300000),))
    big2 = OfferingView("b.2", "spot", "z1", 2, "A10G", 3.0, 64, 512000)
    inp2 = replace(inp2, pools=(pool(offerings=(big2,)),))
    assert len(plan(inp2).launches) == 2


def test_no_shape_fits_says_so() -> None:
    inp = make_input(demand=(DemandGroup("gpu", "vision", 1, None, 0, 1, NOW, False, 64.0, 0),))
    p = plan(inp)
    assert not p.launches and "64 CPU(s)" in p.holds[0].reason


def test_fail_safe_launches_nothing_not_even_pool_minimums() -> None:
    inp = make_input(
        pools=(pool(min_instances=2),),
        demand=(demand("vision", count=3),),
        decision=Decision.failed("policy crashed"),
    )
    p = plan(inp)
    assert p.launches == ()
    assert any("nothing is launched" in n for n in p.notes)


teams = st.sampled_from(["a", "b", "c"])


@settings(max_examples=150, deadline=None)
@given(
    groups=st.lists(st.tuples(teams, st.integers(1, 20), st.sampled_from([1, 2, 4])), min_size=1, max_size=6),
    nominal=st.dictionaries(teams, st.integers(0, 12)),
    borrow=st.dictionaries(teams, st.integers(0, 6)),
    running=st.dictionaries(teams, st.integers(0, 10)),
    idle=st.integers(0, 6),
    frozen=st.sets(teams),
)
def test_plan_never_exceeds_quota_or_places_frozen_work(groups, nominal, borrow, running, idle, frozen) -> None:
    tds = {
        t: TeamDecision(
            nominal_gpus=nominal.get(t),
            borrowing_limit_gpus=borrow.get(t),
            may_scale_up=t not in frozen,
            spend_headroom_per_hour=0.0 if t in frozen else None,
        )
        for t in ("a", "b", "c")
    }
    owners = ["a", "b", None]
    inp = make_input(
        pools=(pool(max_instances=200, offerings=(offering(gpus=4, price=4.0),)),),
        demand=tuple(demand(t, count=n, gpus=g) for t, n, g in groups),
        workers=tuple(worker(f"w{i}", gpus=4, instance_id=f"i{i}") for i in range(idle)),
        instances=tuple(
            instance(f"i{i}", gpus=4, team=owners[i % 3], worker_id=f"w{i}", worker_state="idle") for i in range(idle)
        ),
        running_gpus=dict(running),
        decision=Decision(teams=tds),
    )
    p = plan(inp)
    planned = {t: launched_gpus(p, t) for t in tds}
    for t, td in tds.items():
        if t in frozen:
            assert planned[t] == 0
        if td.nominal_gpus is not None:
            # Placements on existing machines are not itemised per team in the plan, so
            # bound them by what all placements could have given this team.
            cap = td.nominal_gpus + (td.borrowing_limit_gpus or 0) if td.borrowing_limit_gpus is not None else None
            if cap is not None:
                assert running.get(t, 0) + planned[t] <= max(cap, running.get(t, 0))
