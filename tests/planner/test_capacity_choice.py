"""The per-task capacity choice (autoscaler.planner.capacity_choice): hand-computed
cases, the wait target, and a property that it never leaves what the policy allows."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoscaler.planner.capacity_choice import (
    EXPLORE_PREMIUM,
    ON_DEMAND,
    SPOT,
    CapacityModel,
    Checkpointing,
    Option,
    TaskProfile,
    choose,
    expected_cost,
    poisson_mean_within,
)
from autoscaler.planner.reclaim_rate import ReclaimPrior, posterior

# A V100 machine as the simulator prices it: 3.06 USD/h on-demand, 0.918 spot.
OD = Option("on_demand/p3.2xlarge/a", ON_DEMAND, 3.06)
SPOT_A = Option("spot/p3.2xlarge/a", SPOT, 0.918, 0.24)
BOTH = (SPOT, ON_DEMAND)


def test_a_short_task_that_restarts_from_zero_goes_on_spot() -> None:
    # 1 h at 0.24/h: (e^0.24 - 1) / 0.24 = 1.13020 h expected, 0.918 x 1.13020 = 1.0375 USD
    # against 3.06 on-demand.
    c = choose([OD, SPOT_A], TaskProfile(1.0), BOTH, boot_h=0.0)
    assert c.capacity_type == SPOT
    assert c.best_spot is not None and c.best_on_demand is not None
    assert c.best_spot.expected_cost == pytest.approx(1.0375, abs=1e-4)
    assert c.best_spot.expected_reclaims == pytest.approx(0.27125, abs=1e-5)
    assert c.best_on_demand.expected_cost == pytest.approx(3.06)
    assert "spot" in c.reason and "1.04 USD" in c.reason and "3.06 USD" in c.reason


def test_a_30_hour_task_that_restarts_from_zero_goes_on_demand() -> None:
    # (e^(0.24 x 30) - 1) / 0.24 = 5576.8 h: 0.918 x 5576.8 = 5119.5 USD on spot,
    # 3.06 x 30 = 91.8 on-demand.
    c = choose([OD, SPOT_A], TaskProfile(30.0), BOTH, boot_h=0.0)
    assert c.capacity_type == ON_DEMAND
    assert c.best_spot is not None and c.best_on_demand is not None
    assert c.best_spot.expected_cost == pytest.approx(0.918 * math.expm1(7.2) / 0.24)
    assert c.best_spot.expected_cost == pytest.approx(5119.5, abs=0.1)
    assert c.best_on_demand.expected_cost == pytest.approx(91.8)
    assert c.reason.startswith("on-demand")


def test_the_break_even_of_restart_from_zero_is_near_8_hours_at_this_price_ratio() -> None:
    # Break-even where (e^x - 1) / x = 3.06 / 0.918 = 3.33 for x = 0.24 d: x = 2.06,
    # d = 8.6 h (the "beyond about 8 hours").
    assert choose([OD, SPOT_A], TaskProfile(8.4), BOTH, boot_h=0.0).capacity_type == SPOT
    assert choose([OD, SPOT_A], TaskProfile(8.8), BOTH, boot_h=0.0).capacity_type == ON_DEMAND


def test_a_30_hour_task_that_checkpoints_on_the_notice_goes_on_spot() -> None:
    # Boot 0.05 h, nothing lost: T = 30 / (1 - 0.24 x 0.05) = 30.3644 h billed, plus the
    # first boot: 0.918 x 30.4144 = 27.920 USD against 3.06 x 30.05 = 91.953.
    c = choose([OD, SPOT_A], TaskProfile(30.0, Checkpointing.parse("on-signal")), BOTH, boot_h=0.05)
    assert c.capacity_type == SPOT
    assert c.best_spot is not None and c.best_on_demand is not None
    assert c.best_spot.expected_cost == pytest.approx(27.920, abs=1e-3)
    assert c.best_spot.expected_reclaims == pytest.approx(0.24 * 30.3644, abs=1e-3)
    assert c.best_on_demand.expected_cost == pytest.approx(91.953, abs=1e-3)


def test_checkpoints_every_n_minutes_lose_half_an_interval_per_reclaim() -> None:
    # every:60 loses 0.5 h + a 0.05 h boot per reclaim: T = 10 / (1 - 0.24 x 0.55).
    prof = TaskProfile(10.0, Checkpointing.parse("every:60"))
    c = expected_cost(SPOT_A, prof, boot_h=0.05)
    assert c.expected_cost == pytest.approx(0.918 * (0.05 + 10 / (1 - 0.24 * 0.55)))


def test_a_task_that_can_never_finish_between_reclaims_costs_infinity_on_spot() -> None:
    # Losing 5 h per reclaim at 0.24/h: r L = 1.2 >= 1.
    prof = TaskProfile(10.0, Checkpointing.parse("every:600"))
    assert math.isinf(expected_cost(SPOT_A, prof, boot_h=0.0).expected_cost)
    assert choose([OD, SPOT_A], prof, BOTH, boot_h=0.0).capacity_type == ON_DEMAND


def test_a_lower_reclaim_rate_wins_among_spot_offerings_of_equal_price() -> None:
    calm = Option("spot/p3.2xlarge/b", SPOT, 0.918, 0.05)
    c = choose([SPOT_A, calm, OD], TaskProfile(4.0), BOTH, boot_h=0.0)
    assert c.best_spot is not None and c.best_spot.option is calm


# The wait target's cases: 30 min of accumulated wait, 3 min boots (0.05 h): the first
# boot and 9 reclaims fit (floor(0.5 / 0.05) - 1 = 9 more reclaims allowed).
HALF_HOUR = 0.5
ON_SIGNAL = Checkpointing.parse("on-signal")


def test_a_checkpointing_task_whose_reclaims_would_pass_the_wait_target_goes_on_demand() -> None:
    # 30 h on-signal at 0.24/h: T = 30 / (1 - 0.24 x 0.05) = 30.364 h billed, N Poisson of
    # mean 0.24 x 30.364 = 7.287; P(N > 9) = 1 - sum_{i<=9} e^-7.287 7.287^i / i! = 19.98 %,
    # past 5 %. Spot is cheaper (27.92 vs 91.95 USD) but misses: on-demand.
    c = choose([OD, SPOT_A], TaskProfile(30.0, ON_SIGNAL, HALF_HOUR), BOTH, boot_h=0.05)
    assert c.best_spot is not None and c.best_on_demand is not None
    assert c.best_spot.expected_cost == pytest.approx(27.920, abs=1e-3)
    assert c.best_spot.wait_miss_chance == pytest.approx(0.19981, abs=1e-4)
    assert c.capacity_type == ON_DEMAND
    assert "spot is cheaper (spot 27.92 USD" in c.reason and "on-demand 91.95 USD" in c.reason
    assert "would pass the wait target of 30 min" in c.reason and "9 more allowed after 0 so far" in c.reason
    assert "chance of more 20.0%" in c.reason


def test_a_shorter_checkpointing_task_keeps_the_wait_target_on_spot() -> None:
    # 10 h: mean 0.24 x 10.121 = 2.429 reclaims; P(N > 9) = 0.022 %: spot, 9.34 vs 30.75 USD.
    c = choose([OD, SPOT_A], TaskProfile(10.0, ON_SIGNAL, HALF_HOUR), BOTH, boot_h=0.05)
    assert c.capacity_type == SPOT
    assert c.best_spot is not None and c.best_spot.wait_miss_chance == pytest.approx(2.2158e-4, rel=1e-3)
    assert "keeps the wait target of 30 min" in c.reason and "chance of more 0.0%" in c.reason


def test_a_repeatedly_reclaimed_task_goes_on_demand_when_its_wait_would_pass_the_target() -> None:
    # The same 10 h task after 8 reclaims has waited 9 boots (27 min): one more reclaim
    # is allowed; P(N > 1) = 1 - e^-2.429 (1 + 2.429) = 69.8 %: on-demand.
    prof = TaskProfile(10.0, ON_SIGNAL, HALF_HOUR, reclaims_so_far=8)
    c = choose([OD, SPOT_A], prof, BOTH, boot_h=0.05)
    assert c.best_spot is not None and c.best_spot.wait_miss_chance == pytest.approx(0.69785, abs=1e-4)
    assert c.capacity_type == ON_DEMAND
    assert "1 more allowed after 8 so far" in c.reason
    # Nine reclaims so far: none more allowed, the next one passes the target for sure.
    gone = choose([OD, SPOT_A], TaskProfile(10.0, ON_SIGNAL, HALF_HOUR, reclaims_so_far=9), BOTH, boot_h=0.05)
    assert gone.capacity_type == ON_DEMAND and gone.best_spot is not None
    assert gone.best_spot.wait_miss_chance == pytest.approx(1 - math.exp(-0.24 * 10 / (1 - 0.24 * 0.05)))


def test_restart_from_zero_counts_its_reclaims_as_geometric() -> None:
    # Each attempt is reclaimed with q = 1 - e^(-0.24 d); P(N > 9) = q^10.
    # 5 h: q = 0.6988, q^10 = 2.78 %: spot (8.92 vs 15.45 USD).
    five = choose([OD, SPOT_A], TaskProfile(5.0, wait_target_h=HALF_HOUR), BOTH, boot_h=0.05)
    assert five.capacity_type == SPOT
    assert five.best_spot is not None and five.best_spot.wait_miss_chance == pytest.approx(0.027769, abs=1e-5)
    # 7 h: q = 0.8136, q^10 = 12.7 %: spot is cheaper (16.74 vs 21.57 USD) but misses.
    seven = choose([OD, SPOT_A], TaskProfile(7.0, wait_target_h=HALF_HOUR), BOTH, boot_h=0.05)
    assert seven.best_spot is not None and seven.best_spot.expected_cost == pytest.approx(16.744, abs=1e-3)
    assert seven.best_spot.wait_miss_chance == pytest.approx(0.12713, abs=1e-4)
    assert seven.capacity_type == ON_DEMAND


def test_a_calmer_zone_that_keeps_the_target_goes_before_a_cheaper_one_that_misses() -> None:
    # At 0.05/h and 1.00 USD/h, 30 h is 1.50 reclaims expected, P(N > 9) = 4e-6: it keeps
    # the target at 30.13 USD, dearer than the stormy zone's 27.92 but far below on-demand.
    calm = Option("spot/p3.2xlarge/b", SPOT, 1.0, 0.05)
    c = choose([OD, SPOT_A, calm], TaskProfile(30.0, ON_SIGNAL, HALF_HOUR), BOTH, boot_h=0.05)
    assert c.capacity_type == SPOT
    assert c.best_spot is not None and c.best_spot.option is calm
    assert c.best_spot.expected_cost == pytest.approx(30.125, abs=1e-3)


def test_a_boot_past_the_target_misses_it_on_demand_too_so_cost_decides() -> None:
    # A 20 min boot against a 15 min target: the first boot alone passes it on either
    # capacity type, so the wait gives no reason to pay for on-demand.
    prof = TaskProfile(4.0, ON_SIGNAL, wait_target_h=0.25)
    c = choose([OD, SPOT_A], prof, BOTH, boot_h=1 / 3)
    assert c.best_on_demand is not None and c.best_on_demand.misses_wait_target
    assert c.capacity_type == SPOT


def test_without_a_target_or_a_boot_the_wait_changes_nothing() -> None:
    prof = TaskProfile(30.0, ON_SIGNAL)
    assert choose([OD, SPOT_A], prof, BOTH, boot_h=0.05).capacity_type == SPOT
    assert "wait target" not in choose([OD, SPOT_A], prof, BOTH, boot_h=0.05).reason
    assert choose([OD, SPOT_A], TaskProfile(30.0, ON_SIGNAL, HALF_HOUR), BOTH, boot_h=0.0).capacity_type == SPOT


def test_a_policy_that_allows_one_capacity_type_gets_it_whatever_it_costs() -> None:
    assert choose([OD, SPOT_A], TaskProfile(30.0), (SPOT,), boot_h=0.0).capacity_type == SPOT
    assert choose([OD, SPOT_A], TaskProfile(0.1), (ON_DEMAND,), boot_h=0.0).capacity_type == ON_DEMAND
    none = choose([OD, SPOT_A], TaskProfile(1.0), (), boot_h=0.0)
    assert none.capacity_type is None and "no offering" in none.reason


@pytest.mark.parametrize("bad", ["sometimes", "every:", "every:0", "every:-5", "every:nan", "every:x"])
def test_a_bad_checkpoint_declaration_says_what_is_accepted(bad: str) -> None:
    with pytest.raises(ValueError, match="none, on-signal or every:MIN"):
        Checkpointing.parse(bad)


def test_checkpoint_declarations_round_trip() -> None:
    for text in ("none", "on-signal", "every:30", "every:7.5"):
        assert str(Checkpointing.parse(text)) == text
    assert Checkpointing.parse(None).mode == "none"


_types = st.sampled_from([SPOT, ON_DEMAND])
_options = st.lists(
    st.builds(
        Option,
        key=st.text(min_size=1, max_size=8),
        capacity_type=_types,
        hourly_price=st.floats(0.0, 100.0),
        reclaim_rate=st.floats(0.0, 5.0),
    ),
    max_size=6,
)
_profiles = st.builds(
    TaskProfile,
    runtime_h=st.floats(0.0, 1000.0),
    checkpointing=st.sampled_from([Checkpointing(), Checkpointing("on-signal"), Checkpointing("every", 30.0)]),
    wait_target_h=st.none() | st.floats(0.0, 2.0),
    reclaims_so_far=st.integers(0, 50),
)


@given(_options, _profiles, st.sets(_types), st.floats(0.0, 1.0))
def test_the_choice_never_leaves_the_allowed_capacity_types(
    options: list[Option], profile: TaskProfile, allowed: set[str], boot_h: float
) -> None:
    c = choose(options, profile, allowed, boot_h=boot_h)
    offered = {o.capacity_type for o in options} & allowed
    if not offered:
        assert c.capacity_type is None
        return
    assert c.capacity_type in offered
    chosen = c.chosen
    assert chosen is not None and chosen.option.capacity_type in allowed
    assert chosen.option in options


def test_no_allowed_type_at_all_says_so_rather_than_listing_nothing() -> None:
    # A spot-only team in a queue of on-demand pools: `task why` printed
    # "no offering of an allowed capacity type ()".
    c = choose([OD], TaskProfile(1.0), set(), boot_h=0.0)
    assert c.capacity_type is None
    assert c.reason == "no offering: the policy allows none of the capacity types the pools offer"
    assert choose([OD], TaskProfile(1.0), {SPOT}, boot_h=0.0).reason == "no offering of an allowed capacity type (spot)"


# Trying a zone (module docstring): zone a has evidence (0.16/h, optimistic 0.147/h),
# zone b only the prior (0.24/h, optimistic 0.24 - sqrt(0.24 x 20) / 20 = 0.1305/h).
TRIED_A = Option("spot/p3.2xlarge/a", SPOT, 0.918, 0.16, 0.147)
UNTRIED_B = Option("spot/p3.2xlarge/b", SPOT, 0.918, 0.24, 0.1305)


def test_a_zone_never_tried_is_tried_by_a_task_that_checkpoints() -> None:
    # 30 h on the notice, boot 0.05 h: a 0.918 x (0.05 + 30 / (1 - 0.16 x 0.05)) = 27.8080,
    # b 0.918 x (0.05 + 30 / (1 - 0.24 x 0.05)) = 27.9204 (0.40 % more: within 5 %);
    # optimistic (0.147, 0.1305): a 27.7898, b 27.7668, so b is tried. Spot won on a's 27.81.
    c = choose([TRIED_A, UNTRIED_B, OD], TaskProfile(30.0, ON_SIGNAL), BOTH, boot_h=0.05)
    assert c.capacity_type == SPOT
    assert c.best_spot is not None and c.best_spot.option is UNTRIED_B
    assert c.best_spot.expected_cost == pytest.approx(27.9204, abs=1e-4)
    assert c.best_spot.optimistic_cost == pytest.approx(27.7668, abs=1e-4)
    assert "spot: expected spot 27.81 USD" in c.reason
    assert "trying spot/p3.2xlarge/b" in c.reason and "within 5% of spot/p3.2xlarge/a" in c.reason


def test_a_long_task_that_restarts_from_zero_never_tries_a_zone() -> None:
    # 6 h from zero: a 0.918 x (e^0.96 - 1) / 0.16 = 9.25 USD, b 0.918 x (e^1.44 - 1) / 0.24
    # = 12.32 (33 % more): b is not near enough to try, whatever its optimistic rate.
    c = choose([TRIED_A, UNTRIED_B, OD], TaskProfile(6.0), BOTH, boot_h=0.0)
    assert c.best_spot is not None and c.best_spot.option is TRIED_A
    assert "trying" not in c.reason


def test_trying_a_zone_never_turns_on_demand_into_spot() -> None:
    # 30 h from zero at 0.24/h: spot 5,119.5 USD on the estimate against on-demand 91.8
    # (the case above); an optimistic rate of 0 on the untried zone (spot 27.54 if it held)
    # does not change that: the type is decided on the estimate.
    hopeful = Option("spot/p3.2xlarge/b", SPOT, 0.918, 0.24, 0.0)
    c = choose([hopeful, OD], TaskProfile(30.0), BOTH, boot_h=0.0)
    assert c.capacity_type == ON_DEMAND and c.best_spot is not None and c.best_spot.option is hopeful
    assert "trying" not in c.reason


_explored = st.lists(
    st.builds(
        Option,
        key=st.sampled_from(["spot/x/a", "spot/x/b", "spot/x/c", "on_demand/x/a"]),
        capacity_type=_types,
        hourly_price=st.floats(0.0, 100.0),
        reclaim_rate=st.floats(0.0, 5.0),
        optimistic_rate=st.none() | st.floats(0.0, 5.0),
    ),
    max_size=6,
    unique_by=lambda o: o.key,
)


@given(_explored, _profiles, st.sets(_types), st.floats(0.0, 1.0))
def test_trying_a_zone_changes_neither_the_type_nor_the_cost_by_more_than_the_premium(
    options: list[Option], profile: TaskProfile, allowed: set[str], boot_h: float
) -> None:
    c = choose(options, profile, allowed, boot_h=boot_h)
    plain = choose([dataclasses.replace(o, optimistic_rate=None) for o in options], profile, allowed, boot_h=boot_h)
    assert c.capacity_type == plain.capacity_type
    assert (c.best_on_demand is None) == (plain.best_on_demand is None)
    if c.capacity_type == SPOT:
        assert c.best_spot is not None and plain.best_spot is not None
        assert c.best_spot.misses_wait_target == plain.best_spot.misses_wait_target
        assert c.best_spot.expected_cost <= plain.best_spot.expected_cost * (1 + EXPLORE_PREMIUM) + 1e-9


def test_with_optimism_the_fleet_learns_the_calm_zone_and_without_it_stays_in_the_first() -> None:
    """Three zones at equal price, true rates 0.16, 0.10, 0.15 (the default world's AWS
    zones), the 0.24/h prior worth 20 h: one-hour checkpointing tasks placed one after
    another, each adding its hour and its (seeded) reclaims to its zone's evidence."""
    prior = ReclaimPrior(0.24, 20.0, 0.0)
    true = {"spot/x/a": 0.16, "spot/x/b": 0.10, "spot/x/c": 0.15}

    def run(optimism: bool) -> dict[str, int]:
        rng = random.Random(7)
        hours = dict.fromkeys(true, 0.0)
        reclaims = dict.fromkeys(true, 0.0)
        used = dict.fromkeys(true, 0)
        for i in range(4000):
            est = {k: posterior(hours[k], reclaims[k], prior) for k in true}
            options = [Option(k, SPOT, 0.918, e.rate, e.optimistic if optimism else None) for k, e in est.items()]
            key = choose(options, TaskProfile(1.0, ON_SIGNAL), {SPOT}, boot_h=0.05).best_spot.option.key  # type: ignore[union-attr]
            hours[key] += 1.0
            reclaims[key] += sum(1 for _ in range(10) if rng.random() < true[key] / 10)
            used[key] += i >= 3000  # where the last thousand went
        return used

    assert run(optimism=False)["spot/x/a"] == 1000  # the first zone tried, ever after
    learned = run(optimism=True)
    assert learned["spot/x/b"] >= 700, learned


def test_with_standby_machines_a_long_checkpointing_task_keeps_its_wait_target_on_spot() -> None:
    # The 30 h on-signal task above missed the target on spot (7.287 reclaims expected,
    # each a boot). With standby machines a reclaim waits a boot only when none is free
    # (5 %): boot waits are Poisson of mean 0.05 x 7.287 = 0.364; P(N > 9) is about 1e-11.
    prof = TaskProfile(30.0, ON_SIGNAL, HALF_HOUR, standby_miss=0.05)
    c = choose([OD, SPOT_A], prof, BOTH, boot_h=0.05)
    assert c.capacity_type == SPOT and c.best_spot is not None
    mean = 0.05 * 0.24 * 30.0 / (1 - 0.24 * 0.05)
    assert c.best_spot.wait_miss_chance == pytest.approx(
        1 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(10)), abs=1e-12
    )
    assert c.best_spot.expected_cost == pytest.approx(27.920, abs=1e-3)  # the cost is unchanged
    assert "with standby machines a reclaim waits (chance 5%) a 3 min boot" in c.reason


def test_the_model_counts_covered_reclaims_as_boots_only_at_the_miss_chance() -> None:
    model = CapacityModel(wait_target_h=0.5, standby_miss=0.05)
    # 40 reclaims lived through with standby cost about 2 boots of wait, not 40.
    assert model.profile(30.0, "on-signal", 40).reclaims_so_far == 2
    assert model.profile(30.0, "on-signal", 40).standby_miss == 0.05
    # A task that restarts from zero is not covered: each reclaim is a boot, as before.
    assert model.profile(30.0, "none", 40) == TaskProfile(30.0, Checkpointing(), 0.5, 40, None)
    assert CapacityModel(wait_target_h=0.5).profile(30.0, "on-signal", 40).reclaims_so_far == 40


def test_standby_is_needed_only_by_tasks_whose_reclaims_would_pass_the_target_without_it() -> None:
    model = CapacityModel({"spot/a": 0.24}, wait_target_h=0.5, standby_miss=0.01)
    # The largest Poisson mean with P(N > 9) <= 5 %: 9 more reclaims allowed at 30 min
    # and 3 min boots.
    within = poisson_mean_within(9)
    assert within == pytest.approx(5.4254, abs=1e-3)
    assert 1 - sum(math.exp(-within) * within**i / math.factorial(i) for i in range(10)) == pytest.approx(0.05)
    # 30 h left at 0.24/h: 7.287 reclaims expected, 20 % past 9 if each waited a boot: it
    # keeps the target while a reclaim finds no standby with chance up to 5.43 / 7.287.
    need = model.standby_miss_needed("spot/a", 30.0, "on-signal", 0)
    assert need == pytest.approx(within / (0.24 * 30.0 / (1 - 0.24 * 0.05)))
    # 1,000 h: 242.9 expected, so at most 2.2 % (a lone such task needs one machine).
    assert model.standby_miss_needed("spot/a", 1000.0, "on-signal", 0) == pytest.approx(0.02234, abs=1e-4)
    # 10 h left: 2.4 expected, 0.02 % past 9: keeps the target on its own.
    assert model.standby_miss_needed("spot/a", 10.0, "on-signal", 0) is None
    # After 1,000 covered reclaims (round(0.01 x 1,000) = 10 boots spent) none is left:
    # the least the choice assumes, 1 %.
    assert model.standby_miss_needed("spot/a", 10.0, "on-signal", 1000) == 0.01
    # Restarting from zero, no target, or no standby: never.
    assert model.standby_miss_needed("spot/a", 30.0, "none", 0) is None
    assert replace(model, wait_target_h=None).standby_miss_needed("spot/a", 30.0, "on-signal", 0) is None
    assert replace(model, standby_miss=None).standby_miss_needed("spot/a", 30.0, "on-signal", 0) is None
