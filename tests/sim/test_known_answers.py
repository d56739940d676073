"""Seeded worlds small enough to work out by hand, run through the real loop."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from autoscaler.sim import metrics
from autoscaler.sim.engine import kept_s
from tests.sim.helpers import one_pool, policy_with_budgets, run, settings, tasks


def test_one_task_one_launch_exact_cost(tmp_path: Path) -> None:
    # t=0: the cycle launches one spot g1 ($1/h); it registers at 120 s and runs the
    # task until 3720 s; idle for 300 s (a fixed warm pool keeps it for its idle
    # timeout), the cycle at 4021 s drains it, the agent leaves, and the next cycle
    # (one 15 s interval later) terminates it at 4036 s.
    out = run(tasks(("lab", 0.0, 3600.0, 1)), one_pool(("lab",), warm_pool="fixed"), tmp_path, settings())
    report = metrics.ours(out, None)
    assert report["counts"]["launches"] == 1
    assert report["counts"]["spot_launches"] == 1
    assert report["tasks"]["succeeded"] == 1
    [span] = metrics.spans(out)
    assert (span.start_s, span.end_s, span.price) == (0.0, 4036.0, 1.0)
    assert report["total_cost_usd"] == round(4036 / 3600 * 1.0, 2)
    assert report["waits_s"]["p50"] == 120.0  # the boot
    assert report["gpu_hours"]["used"] == 1.0
    assert report["gpu_hours"]["booting"] == round(120 / 3600, 1)
    assert report["completed_work_gpu_hours"] == 1.0
    assert report["usd_per_completed_gpu_hour"] == round(4036 / 3600 * 1.0, 3)


def test_one_task_adaptive_warm_pool_drains_at_the_floor(tmp_path: Path) -> None:
    # As above, but the adaptive warm pool has seen one start in the last hour, far from
    # the 20 that would keep a machine warm against a 3-minute boot: the cycle at the
    # floor (3720 + 30 + 1 s) drains it, and the next one terminates it at 3766 s.
    out = run(tasks(("lab", 0.0, 3600.0, 1)), one_pool(("lab",)), tmp_path, settings())
    report = metrics.ours(out, None)
    [span] = metrics.spans(out)
    assert (span.start_s, span.end_s) == (0.0, 3766.0)
    assert report["total_cost_usd"] == round(3766 / 3600 * 1.0, 2)
    assert report["tasks"]["succeeded"] == 1


def test_burst_beyond_budget_is_held_with_the_exact_alerts(tmp_path: Path) -> None:
    # 12 h before the month ends, a hard budget of $30 allows $2.5/h of new capacity:
    # two $1/h machines. Their forecast (2 x ~12 h = ~$24) crosses the 50 % threshold
    # and no other, so the only alert is a forecast info at 50 %; the other two tasks
    # wait for the first two to finish and run on the same machines.
    budgets = (
        "thresholds_pct: [50, 80, 100]\ndefault: {monthly_usd: null, kind: soft}\n"
        "teams:\n  lab: {monthly_usd: 30, kind: hard}\n"
    )
    policy = policy_with_budgets(tmp_path, budgets)
    start = datetime(2026, 1, 31, 12, tzinfo=UTC)
    wl = tasks(*[("lab", 0.0, 7200.0, 1)] * 4)
    out = run(wl, one_pool(("lab",)), tmp_path, settings(start=start), policy)
    report = metrics.ours(out, policy)
    assert report["counts"]["launches"] == 2
    assert max(c.held for c in out.cycles) == 2
    assert [(a["team"], a["level"], a["threshold_pct"], a["basis"]) for a in report["alerts"]] == [
        ("lab", "info", 50, "forecast")
    ]
    assert report["tasks"]["succeeded"] == 4
    budget = report["teams"]["lab"]["budget"]
    assert budget["within_hard_budget"] is True
    assert budget["max_pct_of_budget"] < 100


def test_budget_spent_freezes_and_drains_in_the_next_month(tmp_path: Path) -> None:
    # One hour before the month ends, $2 of hard budget lets two $1/h machines start.
    # At the month turn the forecast restarts at 2 x 672 h: scale-up freezes (a critical
    # forecast alert) and the remaining work waits while the frozen team's machines run.
    budgets = (
        "thresholds_pct: [50, 80, 100]\ndefault: {monthly_usd: null, kind: soft}\n"
        "teams:\n  lab: {monthly_usd: 2, kind: hard}\n"
    )
    policy = policy_with_budgets(tmp_path, budgets)
    start = datetime(2026, 1, 31, 23, tzinfo=UTC)
    wl = tasks(*[("lab", 0.0, 3 * 3600.0, 1)] * 3)
    out = run(wl, one_pool(("lab",)), tmp_path, settings(start=start, horizon_after_last_arrival_s=6 * 3600.0), policy)
    report = metrics.ours(out, policy)
    frozen_cycles = [c for c in out.cycles if "lab" in c.frozen]
    assert frozen_cycles, "the team was never frozen"
    assert frozen_cycles[0].t_s >= 3600.0  # only after the month turned
    assert ("lab", "critical", 100, "forecast") in [
        (a["team"], a["level"], a["threshold_pct"], a["basis"]) for a in report["alerts"]
    ]
    assert report["teams"]["lab"]["budget"]["frozen_s"] > 0


def test_preemption_requeues_and_completes(tmp_path: Path) -> None:
    # The first spot machine is reclaimed 1 h after launch with a 2 min notice: the agent
    # stops the task at the notice (interrupted:spot), it is requeued and finishes on a
    # second machine, on-demand because its last attempt was reclaimed.
    out = run(tasks(("lab", 0.0, 7200.0, 1)), one_pool(("lab",)), tmp_path, settings(reclaim_first_spot_after_s=3600.0))
    report = metrics.ours(out, None)
    track = next(iter(out.tasks.values()))
    assert track.state == "succeeded"
    assert track.attempts == 2
    assert report["counts"]["preemptions"] == 1
    assert report["counts"]["launches"] == 2
    assert sorted(i.capacity_type for i in out.instances.values()) == ["on_demand", "spot"]
    # 1 GPU ran from 120 s (boot) to 3480 s (the notice) at $1/h and was lost.
    assert report["lost_to_preemption_usd"] == round((3480 - 120) / 3600, 2)


def test_a_task_that_checkpoints_at_the_notice_resumes_where_it_stopped(tmp_path: Path) -> None:
    # As above, but the task writes a checkpoint when told to stop: nothing is lost and
    # the second attempt runs only what was left (7200 - (3480 - 120) = 3840 s).
    sim = settings(reclaim_first_spot_after_s=3600.0, checkpoint_every_s=0.0)
    out = run(tasks(("lab", 0.0, 7200.0, 1)), one_pool(("lab",)), tmp_path, sim)
    report = metrics.ours(out, None)
    track = next(iter(out.tasks.values()))
    assert (track.state, track.attempts) == ("succeeded", 2)
    assert report["lost_to_preemption_usd"] == 0
    assert track.ran_gpu_s == pytest.approx(7200.0)
    # Started at 120 s; requeued at 3480 s; the on-demand machine boots in 120 s.
    assert track.finished_s == pytest.approx(3480.0 + 120.0 + 3840.0, abs=30.0)


@pytest.mark.parametrize(
    ("ran", "every", "told", "kept"),
    [
        (3000.0, None, True, 0.0),  # no checkpoints: everything is lost
        (3000.0, 0.0, True, 3000.0),  # checkpoint on SIGTERM
        (3000.0, 0.0, False, 0.0),  # ...but a vanished machine sends none
        (3000.0, 1200.0, False, 2400.0),  # the last periodic checkpoint survives
        (3000.0, 1200.0, True, 3000.0),
    ],
)
def test_kept_run_time(ran: float, every: float | None, told: bool, kept: float) -> None:
    assert kept_s(ran, every, told_to_stop=told) == kept
