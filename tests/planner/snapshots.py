"""Random planner snapshots that reach every step of `plan()`: dead, stuck and booting
instances, idle and busy workers, static pools, quotas, drained teams, tiers and
weights, pool minimums and a failed policy. The differential tests draw from it;
`test_grouping_differential.py` checks it keeps reaching every step."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from hypothesis import strategies as st

from autoscaler.planner import PlanInput, QueueView, WorkerView
from autoscaler.planner.model import OfferingView
from autoscaler.policy.schema import Decision, PoolDecision, TeamDecision
from tests.planner.builders import NOW, demand, instance, make_input, offering, pool

TEAMS = ["vision", "nlp", "speech"]
INSTANCE_STATES = ["requested", "launching", "booting", "ready", "draining", "lost", "preempted", "boot_timeout"]


def offerings_st(
    *, min_size: int = 0, gpu_types: Sequence[str] = ("A10G", "H100")
) -> st.SearchStrategy[list[OfferingView]]:
    """Up to 5 offerings over 3 instance types, both capacity types and 2 zones: the draw
    the snapshots and the planner's properties (`test_properties.py`) share."""
    return st.lists(
        st.builds(
            offering,
            itype=st.sampled_from(["a", "b", "c"]),
            ct=st.sampled_from(["spot", "on_demand"]),
            gpus=st.sampled_from([0, 1, 2, 4, 8]),
            price=st.floats(0.05, 10, allow_nan=False),
            zone=st.sampled_from(["z1", "z2"]),
            gpu_type=st.sampled_from(list(gpu_types)),
        ),
        min_size=min_size,
        max_size=5,
    )


@st.composite
def snapshots(draw: st.DrawFn) -> PlanInput:
    n_pools = draw(st.integers(1, 3))
    pools = tuple(
        pool(
            f"p{i}",
            offerings=tuple(draw(offerings_st())),
            static=draw(st.booleans()) if i == 0 else False,
            max_instances=draw(st.integers(0, 6)),
            min_instances=draw(st.integers(0, 2)),
            idle_timeout_s=draw(st.sampled_from([0, 60, 300])),
            boot_timeout_s=draw(st.sampled_from([30, 600])),
            tenancy=draw(st.sampled_from(["team", "shared"])),
        )
        for i in range(n_pools)
    )
    names = [p.name for p in pools]
    instances = []
    for k in range(draw(st.integers(0, 8))):
        state = draw(st.sampled_from(INSTANCE_STATES))
        has_worker = state in ("ready", "draining") and draw(st.booleans())
        instances.append(
            instance(
                f"i{k}",
                draw(st.sampled_from(names)),
                state=state,
                worker_id=f"w{k}" if has_worker else None,
                worker_state=draw(st.sampled_from(["idle", "busy", "draining", "gone"])) if has_worker else None,
                gpus=draw(st.sampled_from([0, 1, 2, 4])),
                team=draw(st.sampled_from([*TEAMS, None])),
                age_s=draw(st.sampled_from([10, 100, 1000])),
                price=draw(st.floats(0.1, 5, allow_nan=False)),
            )
        )
    workers = []
    for k in range(draw(st.integers(0, 8))):
        state = draw(st.sampled_from(["idle", "busy", "draining"]))
        gpus = draw(st.sampled_from([0, 1, 2, 4]))
        used = draw(st.integers(0, gpus)) if state != "idle" else 0
        on = [i.id for i in instances if i.pool] + [None]
        workers.append(
            WorkerView(
                f"w{k}",
                draw(st.sampled_from(names)),
                state,
                gpus,
                used,
                used if gpus else draw(st.integers(0, 1)),
                draw(st.sampled_from(["A10G", "H100"])),
                NOW - timedelta(seconds=draw(st.sampled_from([5, 120, 400, 900, 3600]))) if state == "idle" else None,
                draw(st.sampled_from(on)),
                tenant=draw(st.sampled_from([*TEAMS, None])),
            )
        )
    groups = tuple(
        demand(
            draw(st.sampled_from(TEAMS)),
            draw(st.integers(0, 12)),
            draw(st.sampled_from([0, 1, 2, 4, 8])),
            queue=draw(st.sampled_from(["gpu", "cpu", "nowhere"])),
            priority=draw(st.integers(0, 2)),
            gpu_type=draw(st.sampled_from([None, "A10G", "H100", "a10g"])),
            after_reclaim=draw(st.booleans()),
        )
        for _ in range(draw(st.integers(0, 6)))
    )
    teams = {
        t: TeamDecision(
            may_scale_up=draw(st.booleans()),
            spend_headroom_per_hour=draw(st.one_of(st.none(), st.floats(0, 20, allow_nan=False))),
            priority_tier=draw(st.integers(0, 1)),
            priority_weight=draw(st.floats(0.0, 5, allow_nan=False)),
            allowed_capacity_types=draw(st.sampled_from([["spot", "on_demand"], ["on_demand"], ["spot"]])),
            allowed_pools=draw(st.one_of(st.none(), st.lists(st.sampled_from(names), max_size=2))),
            drain=draw(st.integers(0, 9)) == 0,
            nominal_gpus=draw(st.one_of(st.none(), st.integers(0, 8))),
            borrowing_limit_gpus=draw(st.one_of(st.none(), st.integers(0, 4))),
        )
        for t in draw(st.lists(st.sampled_from(TEAMS), unique=True))
    }
    dec = Decision(
        teams=teams,
        default_team=TeamDecision(drain=draw(st.integers(0, 19)) == 0),
        pools={
            n: PoolDecision(
                max_instances=draw(st.one_of(st.none(), st.integers(0, 4))),
                min_instances=draw(st.one_of(st.none(), st.integers(0, 3))),
            )
            for n in draw(st.lists(st.sampled_from(names), unique=True))
        },
        pool_order=draw(st.permutations(names)) if draw(st.booleans()) else [],
        fail_safe=draw(st.integers(0, 9)) == 0,
        error="policy exploded",
    )
    queues = (
        QueueView("gpu", tuple(draw(st.permutations(names))), priority=draw(st.integers(0, 1))),
        QueueView("cpu", tuple(names)),
    )
    running = {t: draw(st.integers(0, 8)) for t in TEAMS}
    return make_input(
        pools=pools,
        queues=queues,
        demand=groups,
        workers=tuple(workers),
        instances=tuple(instances),
        decision=dec,
        running_gpus=running,
    )
