"""The adaptive warm pool: how many idle machines of a kind the planner keeps.

Hand cases of the ski-rental count (floor(starts per hour x boot hours)), the plan's
drains with their reasons, and a property over random fleets: no machine younger than
the warm floor drains, every machine past its idle timeout does, and per kind no more
drain early than the idle machines beyond what the warm pool keeps; a `fixed` pool and
a plan without start counts keep the idle timeout alone.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.planner import plan
from autoscaler.planner.model import PlanInput
from autoscaler.planner.warm_pool import WARM_FLOOR_S, WarmPool
from tests.planner.builders import demand, instance, make_input, pool, worker


def _with(inp: PlanInput, warm: WarmPool | None) -> PlanInput:
    return replace(inp, warm=warm)


def test_keep_is_starts_per_hour_times_the_boot() -> None:
    # 3-minute boots: one machine is worth keeping from one start every 3 minutes.
    assert WarmPool({("cloud", 1): 19}, boot_s=180).keep("cloud", 1) == 0
    assert WarmPool({("cloud", 1): 20}, boot_s=180).keep("cloud", 1) == 1
    assert WarmPool({("cloud", 1): 41}, boot_s=180).keep("cloud", 1) == 2
    # A 10-minute boot makes the same 20 starts worth three warm machines.
    assert WarmPool({("cloud", 1): 20}, boot_s=600).keep("cloud", 1) == 3
    # Starts on another kind keep none of this one.
    assert WarmPool({("cloud", 4): 100}, boot_s=180).keep("cloud", 1) == 0
    assert WarmPool({("cloud", 1): 6}, boot_s=180).rate_per_hour("cloud", 1) == 6.0


def _three_idle(pool_kw: dict[str, object] | None = None) -> PlanInput:
    return make_input(
        pools=(pool(idle_timeout_s=300, **(pool_kw or {})),),
        workers=(
            worker("w-new", idle_s=100, instance_id="i-new"),
            worker("w-mid", idle_s=200, instance_id="i-mid"),
            worker("w-old", idle_s=250, instance_id="i-old"),
        ),
        instances=tuple(
            instance(i, worker_id=w, worker_state="idle")
            for i, w in (("i-new", "w-new"), ("i-mid", "w-mid"), ("i-old", "w-old"))
        ),
    )


def test_the_newest_idle_machines_the_rate_justifies_are_kept_the_rest_drain_with_the_numbers() -> None:
    p = plan(_with(_three_idle(), WarmPool({("cloud", 1): 20}, boot_s=180)))
    assert [d.worker_id for d in p.drains] == ["w-old", "w-mid"]  # longest idle first
    assert all(d.only_if_idle for d in p.drains)
    assert p.drains[0].reason == (
        "idle for 250 s (20 task start(s) on 1-GPU machines of pool cloud in the last 60 min, "
        "one every 3.0 min against a 3 min boot: 1 kept warm)"
    )


def test_a_pool_with_no_recent_starts_keeps_nothing_past_the_floor() -> None:
    inp = make_input(
        pools=(pool(idle_timeout_s=300),),
        workers=(
            worker("w-young", idle_s=WARM_FLOOR_S - 1, instance_id="i-young"),
            worker("w-floor", idle_s=WARM_FLOOR_S, instance_id="i-floor"),
        ),
        instances=(
            instance("i-young", worker_id="w-young", worker_state="idle"),
            instance("i-floor", worker_id="w-floor", worker_state="idle"),
        ),
    )
    p = plan(_with(inp, WarmPool({}, boot_s=180)))
    assert [d.worker_id for d in p.drains] == ["w-floor"]
    assert "no task started on a 1-GPU machine of pool cloud in the last 60 min" in p.drains[0].reason


def test_fixed_pool_and_a_plan_without_start_counts_keep_the_idle_timeout() -> None:
    assert plan(_with(_three_idle({"warm_pool": "fixed"}), WarmPool({}, boot_s=180))).drains == ()
    assert plan(_with(_three_idle(), None)).drains == ()


def test_a_machine_step_two_fills_is_neither_drained_nor_counted_as_warm() -> None:
    # One task takes one of the three machines; the warm pool keeps one of the other two.
    inp = _with(_three_idle(), WarmPool({("cloud", 1): 20}, boot_s=180))
    p = plan(replace(inp, demand=(demand(),)))
    assert p.placed_on_existing == 1 and p.launches == ()
    assert len(p.drains) == 1


def test_the_pool_minimum_still_holds() -> None:
    p = plan(_with(_three_idle({"min_instances": 2}), WarmPool({}, boot_s=180)))
    assert [d.worker_id for d in p.drains] == ["w-old"]


_fleet = st.lists(
    st.tuples(st.sampled_from([1, 4]), st.floats(0, 600, allow_nan=False)),  # (GPUs, seconds idle)
    min_size=0,
    max_size=8,
)


@settings(max_examples=200, deadline=None)
@given(
    fleet=_fleet,
    starts1=st.integers(0, 80),
    starts4=st.integers(0, 80),
    boot_s=st.sampled_from([60.0, 180.0, 600.0]),
    rule=st.sampled_from(["adaptive", "fixed"]),
)
def test_drains_stay_between_the_floor_and_the_timeout(
    fleet: list[tuple[int, float]], starts1: int, starts4: int, boot_s: float, rule: str
) -> None:
    timeout = 300.0
    warm = WarmPool({("cloud", 1): starts1, ("cloud", 4): starts4}, boot_s=boot_s)
    workers = tuple(worker(f"w{i}", gpus=g, idle_s=s, instance_id=f"i{i}") for i, (g, s) in enumerate(fleet))
    machines = tuple(
        instance(f"i{i}", gpus=g, worker_id=f"w{i}", worker_state="idle") for i, (g, _s) in enumerate(fleet)
    )
    inp = _with(
        make_input(pools=(pool(idle_timeout_s=timeout, warm_pool=rule),), workers=workers, instances=machines), warm
    )
    drained = {d.worker_id for d in plan(inp).drains}
    idle = {f"w{i}": (g, s) for i, (g, s) in enumerate(fleet)}
    # Every machine past its idle timeout drains (no demand, no pool minimum).
    assert {w for w, (_g, s) in idle.items() if s >= timeout} <= drained
    for w in drained:
        assert idle[w][1] >= (WARM_FLOOR_S if rule == "adaptive" else timeout)
    for g in (1, 4):
        early = [w for w in drained if idle[w][0] == g and idle[w][1] < timeout]
        of_kind = [w for w, (gg, _s) in idle.items() if gg == g]
        assert len(early) <= max(len(of_kind) - warm.keep("cloud", g), 0)
        # The machines kept early are the newest of their kind.
        kept = [idle[w][1] for w in of_kind if w not in drained]
        assert all(idle[w][1] >= max(kept, default=0.0) for w in early)
