"""The gap to the reclaim-aware bound, by cause (autoscaler.sim.gap): machine time and
task spend split by hand, and on a real run the parts adding up to ours minus the bound
to the cent, with each part where a hand-followed world puts it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.sim import gap, report
from tests.sim.helpers import one_pool, run, settings, tasks

H = 3600.0


def test_machine_time_split_by_hand() -> None:
    # A 4-GPU machine at $4/h ($1 per GPU-hour), launched at 0, registered at 0.5 h,
    # told to drain at 3 h, gone at 3.25 h. Attempts: 2 GPUs 0.5-2.5 h, 1 GPU 1-2 h.
    m = gap.Machine(4, 4.0, "spot", 0.0, 0.5 * H, 3.25 * H, 3.0 * H)
    attempts = [gap.Hold("i", 2, 0.5 * H, 2.5 * H), gap.Hold("i", 1, 1.0 * H, 2.0 * H)]
    parts = gap.machine_parts(m, attempts, [])
    assert parts["boot"] == pytest.approx(4 * 0.5)
    # 0.5-1 h: 2 free; 1-2 h: 1 free; 2-2.5 h: 2 free -> 1.0 + 1.0 + 1.0
    assert parts["idle_partial"] == pytest.approx(3.0)
    assert parts["idle_warm"] == pytest.approx(4 * 0.5)  # 2.5-3 h, nothing on it
    assert parts["idle_draining"] == pytest.approx(4 * 0.25)
    assert parts["gang_reserved"] == 0.0
    # With the attempts' 2 x 2 + 1 x 1 = 5 GPU-hours, the machine's 13 USD are all placed.
    assert sum(parts.values()) + 5.0 == pytest.approx(4.0 * 3.25)


def test_a_gang_reservation_is_its_own_part_and_never_registered_is_all_boot() -> None:
    m = gap.Machine(2, 2.0, "on_demand", 0.0, 0.0, 1.0 * H, None)
    parts = gap.machine_parts(m, [gap.Hold("i", 2, 0.5 * H, 1.0 * H)], [gap.Hold("i", 2, 0.0, 0.5 * H)])
    assert parts["gang_reserved"] == pytest.approx(1.0)
    assert parts["idle_warm"] == parts["idle_partial"] == parts["boot"] == 0.0
    never = gap.Machine(1, 3.0, "spot", 0.0, None, 2.0 * H, None)
    assert gap.machine_parts(never, [], [])["boot"] == pytest.approx(6.0)


def test_task_spend_split_by_hand() -> None:
    spends = [
        # Bound spot 1.0 useful + 0.1 expected restarts; ours finished on on-demand for
        # 2.0 after losing 0.4 on spot: +1.0 useful, +0.3 lost.
        gap.TaskSpend(True, 2.0, 0.4, "on_demand", 1.0, 0.1, "spot_restart"),
        # Same type, a dearer zone: +0.5 useful, nothing lost on either side.
        gap.TaskSpend(True, 1.5, 0.0, "spot", 1.0, 0.0, "spot_restart"),
        # Bound on-demand, ours finished on spot: cheaper by 4.0.
        gap.TaskSpend(True, 1.0, 0.0, "spot", 5.0, 0.0, "on_demand"),
        # Unfinished: ours ran 3.0 of it, the bound pays all 10.0.
        gap.TaskSpend(False, 0.0, 3.0, None, 9.0, 1.0, "on_demand"),
    ]
    parts = gap.task_parts(spends)
    assert parts == pytest.approx(
        {
            "useful_same_type": 0.5,
            "useful_on_demand_where_bound_spot": 1.0,
            "useful_spot_where_bound_on_demand": -4.0,
            "lost_beyond_expected": 0.3,
            "unfinished": -7.0,
        }
    )


def test_a_reclaimed_task_on_the_real_loop(tmp_path: Path) -> None:
    # One 2 h task, 1-GPU machines at spot $1/h, on-demand $2/h, boots of 120 s, no
    # reclaim rate (so the bound is spot, 2.0 USD, no restarts expected). The first spot
    # machine is reclaimed 1 h after launch: the task ran 120-3480 s (the notice) and
    # lost it, then finished on on-demand (the rule after a reclaim).
    out = run(tasks(("lab", 0.0, 7200.0, 1)), one_pool(("lab",)), tmp_path, settings(reclaim_first_spot_after_s=3600.0))
    rep = report.build(out, None)
    g = rep["gap_to_reclaim_aware_bound"]
    assert g["bound_usd"] == rep["reclaim_aware_bound"]["usd"] == 2.0
    assert g["ours_usd"] == rep["total_cost_usd"]
    assert g["unexplained_usd"] == 0.0
    assert round(sum(g["parts_usd"].values()), 2) == pytest.approx(g["gap_usd"], abs=0.011)
    p = g["parts_usd"]
    assert p["lost_beyond_expected"] == round((3480 - 120) / H * 1.0, 2)
    assert p["useful_on_demand_where_bound_spot"] == round(7200 / H * (2.0 - 1.0), 2)
    # Two boots of 120 s: one at $1/h, one at $2/h.
    assert p["boot"] == round(120 / H * (1.0 + 2.0), 2)
    assert g["finished_ran_on"] == {"on_demand where bound spot_restart": 1}
    # The rest is the on-demand machine kept warm past the task, then drained.
    assert p["idle_warm"] > 0
    assert p["unfinished"] == p["useful_same_type"] == p["idle_partial"] == 0.0
    md = report.markdown(rep)
    assert f"## Gap to the reclaim-aware bound (ours): {g['gap_usd']:,.2f} USD" in md
    assert f"| lost_beyond_expected | {p['lost_beyond_expected']:,.2f} |" in md


def test_a_reclaimed_task_that_checkpoints_lost_nothing_and_its_kept_attempt_is_useful(tmp_path: Path) -> None:
    # The same world, the task checkpointing on the notice: the first attempt's 3,360 s
    # (120-3480 s) were kept, and the second resumed from them on spot (the rule after a
    # reclaim is for tasks that restart from zero). Counting the kept attempt as lost, as
    # the split once did, showed 0.93 USD lost and as much "useful" short of the bound.
    sim = settings(reclaim_first_spot_after_s=3600.0, checkpoints_share=1.0)
    out = run(tasks(("lab", 0.0, 7200.0, 1)), one_pool(("lab",)), tmp_path, sim)
    g = report.build(out, None)["gap_to_reclaim_aware_bound"]
    p = g["parts_usd"]
    assert g["unexplained_usd"] == 0.0
    assert g["lost_usd"] == 0.0 and p["lost_beyond_expected"] == 0.0
    assert g["finished_ran_on"] == {"spot where bound spot_checkpoint": 1}
    # Both attempts' GPU time is the task's useful work: 7,200 s at $1/h, but for the
    # seconds an attempt holds its machine between its lease and its start.
    assert p["useful_same_type"] == pytest.approx(0.0, abs=0.02)
    assert p["useful_on_demand_where_bound_spot"] == 0.0


def test_the_bound_splits_into_run_time_and_expected_restarts() -> None:
    # The 1 h, 1 GPU task of the scoreboard's two-zone world: spot at 0.75 per GPU in
    # z2 (0.1/h): 0.75 x (e^0.1 - 1) / 0.1 = 0.7887819, of which 0.75 is the run time.
    from autoscaler.provisioning import catalog_offerings
    from autoscaler.sim import bounds
    from tests.sim.test_scoreboard import _two_zone_world

    wl, cfg = _two_zone_world()
    offers = [o for p in cfg.pools for o in catalog_offerings(p)]
    st = settings(preemption_by_zone={"z1": 0.5, "z2": 0.1})
    usd, how, useful, lost = bounds.task_bound_parts(wl.tasks[0], offers, st, checkpoints=False)
    assert (how, useful) == ("spot_restart", pytest.approx(0.75))
    assert usd == pytest.approx(0.7887819) and lost == pytest.approx(0.0387819)
    # The 30 h task goes on-demand: all of it is run time.
    usd, how, useful, lost = bounds.task_bound_parts(wl.tasks[1], offers, st, checkpoints=False)
    assert (how, usd, useful, lost) == ("on_demand", pytest.approx(60.0), pytest.approx(60.0), 0.0)
