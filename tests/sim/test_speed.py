"""The simulator's shortcuts must not change a decision: lean decision rows, no history
points, and cycles only when time or an event could change what the reconciler does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from autoscaler.reconciler.cycle import Reconciler
from autoscaler.sim import engine as sim_engine
from autoscaler.sim import metrics
from autoscaler.state.models import DecisionRecord, HistoryPoint
from tests.sim.helpers import one_pool, policy_with_budgets, run, settings, tasks


def _world() -> Any:
    return tasks(("a", 0.0, 3600.0, 1), ("b", 600.0, 7200.0, 1), ("a", 900.0, 1800.0, 1), ("b", 5000.0, 600.0, 1))


def test_lean_records_change_no_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lean").mkdir()
    (tmp_path / "full").mkdir()
    lean = run(_world(), one_pool(("a", "b")), tmp_path / "lean", settings(reclaim_first_spot_after_s=1800.0))

    class FullRecords(Reconciler):
        def __init__(self, *args: Any, **kw: Any) -> None:
            kw.update(history_interval_s=60.0, record_detail=True)
            super().__init__(*args, **kw)

    monkeypatch.setattr(sim_engine, "Reconciler", FullRecords)
    full = run(_world(), one_pool(("a", "b")), tmp_path / "full", settings(reclaim_first_spot_after_s=1800.0))

    assert metrics.ours(lean, None) == metrics.ours(full, None)
    assert [(c.t_s, c.launches, c.held) for c in lean.cycles] == [(c.t_s, c.launches, c.held) for c in full.cycles]
    launches = metrics.ours(lean, None)["counts"]["launches"]
    with lean.sessions() as s:
        # The real reconciler writes history on its first cycle whatever the interval.
        assert s.scalar(select(func.count(func.distinct(HistoryPoint.at)))) == 1
        rows = list(s.scalars(select(DecisionRecord)))
        assert rows and all(r.reasons == [] and "launches" not in r.plan for r in rows)
        assert sum(r.plan["launches_count"] for r in rows) == launches
    with full.sessions() as s:
        assert (s.scalar(select(func.count()).select_from(HistoryPoint)) or 0) > 0
        assert all(r.reasons for r in s.scalars(select(DecisionRecord)))


def test_no_hourly_tick_without_budgets(tmp_path: Path) -> None:
    # One 20 h task and no budget: after the launch and one re-look, nothing can change
    # with time until the task ends (the shipped policy's default team has no budget),
    # so the run has a handful of cycles, not one an hour.
    out = run(tasks(("lab", 0.0, 20 * 3600.0, 1)), one_pool(("lab",)), tmp_path, settings())
    assert metrics.ours(out, None)["tasks"]["succeeded"] == 1
    assert len(out.cycles) <= 6, [c.t_s for c in out.cycles]


def test_soft_budget_alert_is_timed_by_the_threshold_not_a_tick(tmp_path: Path) -> None:
    # $1/h from the launch at t=0 against a soft $20 budget: actual spend reaches 50 %
    # ($10) at 36,000 s. The simulator schedules a cycle just after that instant from
    # the burn it saw (that cycle accrues the spend; the next one, an interval later,
    # shows it to the policy), instead of looking every hour.
    budgets = (
        "thresholds_pct: [50, 80, 100]\ndefault: {monthly_usd: null, kind: soft}\n"
        "teams:\n  lab: {monthly_usd: 20, kind: soft}\n"
    )
    policy = policy_with_budgets(tmp_path, budgets)
    out = run(tasks(("lab", 0.0, 15 * 3600.0, 1)), one_pool(("lab",)), tmp_path, settings(), policy)
    actual = [a for a in metrics.alert_sequence(out) if a["basis"] == "actual"]
    assert actual, metrics.alert_sequence(out)
    assert actual[0]["threshold_pct"] == 50
    assert 36000.0 <= actual[0]["t_s"] <= 36000.0 + 60.0
    assert len(out.cycles) <= 8, [c.t_s for c in out.cycles]


def test_month_turn_is_a_cycle_even_without_budgets() -> None:
    start = sim_engine.SIM_START
    assert sim_engine._month_turn_s(start, 0.0) == 31 * 86400.0
    assert sim_engine._month_turn_s(start, 31 * 86400.0) == (31 + 28) * 86400.0


def test_clearml_style_ends_at_the_horizon_with_long_tasks() -> None:
    # A 500 h task at 1 reclaim/h is lost and resubmitted by hand forever; the baseline
    # must stop at the same horizon as ours and count it unfinished.
    from autoscaler.sim import baselines

    wl = tasks(("lab", 0.0, 500 * 3600.0, 1))
    out = baselines.clearml_style(
        wl, one_pool(("lab",)), settings(preemption_per_hour=1.0, horizon_after_last_arrival_s=48 * 3600.0)
    )
    assert out["tasks"]["succeeded"] == 0
    assert out["counts"]["preemptions"] > 0
    # It paid for machines but finished no work: no price per finished GPU-hour.
    assert out["total_cost_usd"] > 0 and out["usd_per_completed_gpu_hour"] is None


def _always_look(monkeypatch: pytest.MonkeyPatch) -> None:
    """The drain look-up on every cycle, as before it was skipped."""
    monkeypatch.setattr(sim_engine.Simulation, "_unaware_of_notice", lambda self: True)


def test_skipped_drain_lookup_changes_no_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The spot machine's notice shows 100 s after its launch, its agent registers at
    # 200 s (it never saw the notice, so it leases and runs the task) and the reclaim
    # comes at 500 s: only the sync's notice drain tells that agent, so the look-up
    # must run then. The run must equal the one that looks on every cycle.
    def world(d: Path) -> Any:
        d.mkdir()
        s = settings(boot_delay_s=(200.0, 200.0), reclaim_first_spot_after_s=500.0, notice_s=400.0)
        return run(tasks(("a", 0.0, 3600.0, 1), ("a", 700.0, 1800.0, 1)), one_pool(("a",)), d, s)

    skipped = world(tmp_path / "skipped")
    _always_look(monkeypatch)
    looked = world(tmp_path / "looked")
    assert skipped.preemptions == looked.preemptions == 1
    assert metrics.ours(skipped, None) == metrics.ours(looked, None)
    assert [(c.t_s, c.launches) for c in skipped.cycles] == [(c.t_s, c.launches) for c in looked.cycles]
