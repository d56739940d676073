"""The optimised planner gives exactly the plan of the per-task reference on random inputs.

`planner.plan` keeps demand grouped and indexes free capacity by size; the reference
(`reference_plan.py`) expands one item per task and scans. Any difference in launches,
their order, answers, holds, drains or terminations is a failure: the rewrite must not
change a single decision.
"""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.planner import (
    DemandGroup,
    InstanceView,
    PlanInput,
    PoolView,
    QueueView,
    WorkerView,
    plan,
)
from autoscaler.policy.schema import Decision, PoolDecision, QueueDecision, TeamDecision
from tests.planner import reference_plan
from tests.planner.builders import NOW, offering

TEAMS = ["vision", "nlp", "speech", "ops"]
GPU_TYPES = [None, "A10G", "NVIDIA A100-SXM4-80GB", "A100"]
QUEUES = ["q0", "q1", "q2"]


@st.composite
def pools_st(draw: st.DrawFn) -> tuple[PoolView, ...]:
    out = []
    for i in range(draw(st.integers(1, 4))):
        static = draw(st.booleans()) and i > 0
        offerings = tuple(
            draw(
                st.lists(
                    st.builds(
                        offering,
                        itype=st.sampled_from(["a", "b", "c"]),
                        ct=st.sampled_from(["spot", "on_demand"]),
                        gpus=st.sampled_from([0, 1, 2, 4, 8]),
                        price=st.sampled_from([0.1, 0.4, 1.0, 1.5, 3.0, 8.0]),
                        zone=st.sampled_from(["z1", "z2"]),
                        gpu_type=st.sampled_from(["A10G", "NVIDIA A100-SXM4-80GB"]),
                    ),
                    min_size=0 if static else 1,
                    max_size=6,
                )
            )
        )
        blocked = draw(
            st.frozensets(st.sampled_from(["*", "zone:z1", "spot/a/z1", "on_demand/b/z2", "spot/c/z2"]), max_size=2)
        )
        out.append(
            PoolView(
                f"p{i}",
                "static" if static else "fake",
                static,
                draw(st.sampled_from([("spot", "on_demand"), ("on_demand", "spot"), ("on_demand",)])),
                draw(st.integers(0, 2)),
                draw(st.integers(0, 12)),
                draw(st.sampled_from([0.0, 60.0, 300.0])),
                draw(st.sampled_from([60.0, 600.0])),
                offerings,
                blocked=blocked if draw(st.integers(0, 3)) == 0 else frozenset(),
                backoff_until=NOW + timedelta(seconds=30) if draw(st.integers(0, 5)) == 0 else None,
            )
        )
    return tuple(out)


@st.composite
def inputs(draw: st.DrawFn) -> PlanInput:
    pools = draw(pools_st())
    names = [p.name for p in pools]
    queues = tuple(
        QueueView(q, tuple(draw(st.permutations(names))[: draw(st.integers(0, len(names)))]), draw(st.integers(0, 1)))
        for q in QUEUES
    )
    instances = []
    workers = []
    for k in range(draw(st.integers(0, 12))):
        pool_name = draw(st.sampled_from([*names, "gone-pool"]))
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        gpu_type = draw(st.sampled_from(GPU_TYPES)) if gpus else None
        state = draw(st.sampled_from(["requested", "booting", "ready", "ready", "ready", "draining", "lost"]))
        # A ready machine mostly has its worker (idle ones are what scale-down picks
        # from); without one, or with a gone one, it is cleaned up.
        wstate = None
        if state in ("ready", "draining"):
            wstate = draw(st.sampled_from(["idle", "idle", "idle", "busy", "draining", "gone", None]))
        wid = f"w{k}" if wstate is not None else None
        instances.append(
            InstanceView(
                f"i{k}",
                pool_name,
                state,
                gpus,
                gpu_type,
                "a",
                "spot",
                1.0,
                NOW - timedelta(seconds=draw(st.sampled_from([5, 900]))),
                draw(st.sampled_from([None, *TEAMS])),
                None,
                wid,
                wstate,
            )
        )
        if wid is not None and wstate != "gone":
            assert wstate is not None
            used = 0 if wstate == "idle" else draw(st.integers(0, gpus))
            workers.append(
                WorkerView(
                    wid,
                    pool_name,
                    wstate,
                    gpus,
                    used,
                    (used if gpus else draw(st.integers(0, 1))) if wstate != "idle" else 0,
                    gpu_type,
                    NOW - timedelta(seconds=draw(st.sampled_from([10, 400]))) if wstate == "idle" else None,
                    f"i{k}",
                )
            )
    # Workers without an instance of ours: on-prem machines and strays.
    for k in range(draw(st.integers(0, 8))):
        gpus = draw(st.sampled_from([0, 1, 2, 8]))
        used = draw(st.integers(0, gpus))
        wstate = draw(st.sampled_from(["idle", "idle", "busy"]))
        workers.append(
            WorkerView(
                f"s{k}",
                draw(st.sampled_from(names)),
                wstate,
                gpus,
                used if wstate == "busy" else 0,
                (used if gpus else 1) if wstate == "busy" else 0,
                draw(st.sampled_from(GPU_TYPES)) if gpus else None,
                NOW - timedelta(seconds=draw(st.sampled_from([10, 400]))) if wstate == "idle" else None,
            )
        )
    demand = tuple(
        DemandGroup(
            draw(st.sampled_from([*QUEUES, "unknown-queue"])),
            draw(st.sampled_from(TEAMS)),
            draw(st.sampled_from([0, 1, 1, 2, 4, 8])),
            draw(st.sampled_from(GPU_TYPES)),
            draw(st.integers(0, 2)),
            draw(st.integers(1, 25)),
            NOW - timedelta(seconds=draw(st.integers(0, 5))) if draw(st.booleans()) else None,
        )
        for _ in range(draw(st.integers(0, 12)))
    )
    teams = {
        t: TeamDecision(
            may_scale_up=draw(st.integers(0, 5)) > 0,
            drain=draw(st.integers(0, 9)) == 0,
            spend_headroom_per_hour=draw(st.one_of(st.none(), st.sampled_from([0.0, 0.5, 2.0, 10.0, 40.0]))),
            priority_tier=draw(st.integers(0, 1)),
            priority_weight=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0])),
            allowed_capacity_types=draw(st.sampled_from([["spot", "on_demand"], ["on_demand"], ["spot"]])),
            max_spot_price=draw(st.sampled_from([None, None, 0.5])),
            allowed_pools=draw(st.one_of(st.none(), st.lists(st.sampled_from(names), max_size=2))),
        )
        for t in TEAMS
        if draw(st.integers(0, 4)) > 0
    }
    decision = Decision(
        teams=teams,
        default_team=TeamDecision(drain=draw(st.integers(0, 19)) == 0),
        pools={
            n: PoolDecision(
                max_instances=draw(st.one_of(st.none(), st.integers(0, 8))),
                min_instances=draw(st.one_of(st.none(), st.integers(0, 3))),
            )
            for n in names
            if draw(st.integers(0, 3)) == 0
        },
        queues={
            q: QueueDecision(allowed_pools=draw(st.lists(st.sampled_from(names), max_size=3)))
            for q in QUEUES
            if draw(st.integers(0, 3)) == 0
        },
        pool_order=draw(st.one_of(st.just([]), st.permutations(names))),
    )
    running = {t: draw(st.integers(0, 6)) for t in TEAMS if draw(st.booleans())}
    return PlanInput(NOW, queues, pools, demand, tuple(workers), tuple(instances), decision, running)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs())
def test_same_plan_as_the_per_task_reference(inp: PlanInput) -> None:
    assert plan(inp) == reference_plan.plan(inp)
