"""Hypothesis properties of the planner over random fleets, demand and decisions."""

from __future__ import annotations

from collections import Counter, defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.planner import PlanInput, QueueView, plan
from autoscaler.planner.model import LIVE_STATES
from autoscaler.policy.schema import Decision, TeamDecision
from tests.planner.builders import demand, instance, make_input, pool, worker
from tests.planner.snapshots import TEAMS, offerings_st


@st.composite
def inputs(draw: st.DrawFn) -> PlanInput:
    n_pools = draw(st.integers(1, 3))
    pools = tuple(
        pool(
            f"p{i}",
            offerings=tuple(draw(offerings_st(min_size=1, gpu_types=["A10G"]))),
            max_instances=draw(st.integers(0, 6)),
        )
        for i in range(n_pools)
    )
    instances = tuple(
        instance(
            f"i{k}",
            draw(st.sampled_from([p.name for p in pools])),
            state=draw(st.sampled_from(["booting", "ready", "draining"])),
            worker_id=None,
            gpus=draw(st.sampled_from([0, 1, 2])),
            age_s=10,
        )
        for k in range(draw(st.integers(0, 4)))
    )
    groups = tuple(
        demand(
            draw(st.sampled_from(TEAMS)),
            draw(st.integers(1, 6)),
            draw(st.sampled_from([0, 1, 2, 4])),
            queue=draw(st.sampled_from(["gpu", "cpu"])),
            priority=draw(st.integers(0, 2)),
        )
        for _ in range(draw(st.integers(0, 5)))
    )
    teams = {
        t: TeamDecision(
            may_scale_up=draw(st.booleans()),
            spend_headroom_per_hour=draw(st.one_of(st.none(), st.floats(0, 20, allow_nan=False))),
            priority_tier=draw(st.integers(0, 1)),
            priority_weight=draw(st.floats(0.1, 5, allow_nan=False)),
            allowed_capacity_types=draw(st.sampled_from([["spot", "on_demand"], ["on_demand"], ["spot"]])),
        )
        for t in TEAMS
    }
    return make_input(pools=pools, demand=groups, instances=instances, decision=Decision(teams=teams))


@settings(max_examples=80, deadline=None)
@given(inputs())
def test_never_above_pool_max(inp: PlanInput) -> None:
    p = plan(inp)
    gone = {t.instance_id for t in p.terminations}
    live = Counter(i.pool for i in inp.instances if i.state in LIVE_STATES and i.id not in gone)
    launched = Counter(x.pool for x in p.launches)
    for pl in inp.pools:
        if launched[pl.name]:
            assert live[pl.name] + launched[pl.name] <= pl.max_instances


@settings(max_examples=80, deadline=None)
@given(inputs())
def test_never_beyond_team_spend_headroom(inp: PlanInput) -> None:
    p = plan(inp)
    spent: defaultdict[str, float] = defaultdict(float)
    for x in p.launches:
        spent[x.team] += x.offering.hourly_price
    for team, usd in spent.items():
        headroom = inp.decision.team(team).spend_headroom_per_hour
        assert headroom is None or usd <= headroom + 1e-6


@settings(max_examples=80, deadline=None)
@given(inputs())
def test_every_launched_gpu_answers_pending_demand(inp: PlanInput) -> None:
    p = plan(inp)
    pending: Counter[tuple[str, str, int]] = Counter()
    for g in inp.demand:
        pending[(g.team, g.queue, g.gpus)] += g.count
    answered: Counter[tuple[str, str, int]] = Counter()
    for x in p.launches:
        assert x.answers, "a launch that answers no queued task"
        used = sum(max(n, 1) if x.offering.gpus else 1 for _, n in x.answers)
        assert used <= max(x.offering.gpus, 1)
        # The machine is no bigger than needed by more than one of its smallest tasks' worth:
        # every GPU bought beyond the answered ones is the rounding of one shape.
        for q, want in x.answers:
            answered[(x.team, q, want)] += 1
            assert (want == 0) == (x.offering.gpus == 0), "GPU machines only for GPU work"
    for key, n in answered.items():
        assert n <= pending[key]


@settings(max_examples=60, deadline=None)
@given(n_tasks=st.integers(0, 8), n_onprem=st.integers(0, 5), cloud_max=st.integers(0, 5))
def test_onprem_capacity_is_used_before_cloud(n_tasks: int, n_onprem: int, cloud_max: int) -> None:
    onprem = pool("onprem", static=True)
    cloud = pool("cloud", max_instances=cloud_max)
    inp = make_input(
        pools=(cloud, onprem),
        queues=(QueueView("gpu", ("cloud", "onprem")),),
        demand=(demand(count=n_tasks),) if n_tasks else (),
        workers=tuple(worker(f"w{i}", "onprem") for i in range(n_onprem)),
    )
    p = plan(inp)
    assert p.placed_on_existing == min(n_tasks, n_onprem)
    assert len(p.launches) == min(max(n_tasks - n_onprem, 0), cloud_max)
