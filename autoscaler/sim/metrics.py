"""Our system's figures from one simulation: the common summary (cost, GPU-hours,
waits, counts) plus what only a policy-driven loop has: budget adherence per team
(highest % of a monthly budget, time frozen), the alert sequence, and fair share
(GPU share against weight share)."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from autoscaler.ledger.spend import month_bounds
from autoscaler.policy.bundle import shipped_policy_dir
from autoscaler.sim.budgets import read_budgets
from autoscaler.sim.engine import SimOutcome
from autoscaler.sim.summary import Span, TaskResult, summarize
from autoscaler.state.models import Instance


def budgets(policy_dir: Path | None) -> dict[str, tuple[float, str]]:
    """team -> (monthly USD, kind) for the teams data/budgets.yaml names with a budget."""
    found = read_budgets(policy_dir or shipped_policy_dir())
    teams = found.teams if found else {}
    return {t: (b.monthly_usd, b.kind) for t, b in teams.items() if b.monthly_usd is not None}


def spans(outcome: SimOutcome) -> list[Span]:
    start = outcome.settings.start
    out: list[Span] = []
    with outcome.sessions() as s:
        rows = list(s.scalars(select(Instance).where(Instance.launched_at.is_not(None))))
    for inst in rows:
        assert inst.launched_at is not None
        t0 = (_utc(inst.launched_at) - start).total_seconds()
        t1 = (_utc(inst.terminated_at) - start).total_seconds() if inst.terminated_at else outcome.end_s
        track = outcome.instances.get(inst.id)
        out.append(Span(inst.team or "shared", inst.gpus, inst.hourly_price, t0, t1, track.ready_s if track else None))
    return out


def _utc(dt: Any) -> Any:
    from datetime import UTC

    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def monthly_spend(outcome: SimOutcome, span_list: list[Span]) -> dict[str, dict[str, float]]:
    """team -> {YYYY-MM: USD}, each span cut at calendar month boundaries."""
    start = outcome.settings.start
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for sp in span_list:
        a, b = start + timedelta(seconds=sp.start_s), start + timedelta(seconds=sp.end_s)
        cur = a
        while cur < b:
            _, nxt = month_bounds(cur)
            end = min(nxt, b)
            out[sp.team][f"{cur:%Y-%m}"] += sp.price * (end - cur).total_seconds() / 3600.0
            cur = end
    return {t: dict(m) for t, m in out.items()}


def alert_sequence(outcome: SimOutcome) -> list[dict[str, Any]]:
    """Alerts as they first appear (a standing alert is not repeated every cycle)."""
    seen: set[tuple[str, str, float, str]] = set()
    out: list[dict[str, Any]] = []
    for c in outcome.cycles:
        current = set(c.alerts)
        for a in sorted(current - seen):
            out.append({"t_s": round(c.t_s, 1), "team": a[0], "level": a[1], "threshold_pct": a[2], "basis": a[3]})
        seen = current
    return out


def frozen_seconds(outcome: SimOutcome) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    cycles = outcome.cycles
    for c, nxt in zip(cycles, [*cycles[1:], None], strict=True):
        until = nxt.t_s if nxt is not None else outcome.end_s
        for team in c.frozen:
            out[team] += until - c.t_s
    return dict(out)


def ours(outcome: SimOutcome, policy_dir: Path | None) -> dict[str, Any]:
    span_list = spans(outcome)
    task_results = []
    for tr in outcome.tasks.values():
        wait = tr.wait_s
        if tr.state == "queued":
            wait += outcome.end_s - tr.queued_since  # still waiting when the run stopped
        task_results.append(
            TaskResult(
                tr.trace.team,
                wait,
                tr.state == "succeeded",
                tr.started_s is not None,
                tr.trace.gpus * tr.trace.duration_s,
            )
        )
    used = sum(tr.ran_gpu_s for tr in outcome.tasks.values())
    lost = sum(tr.lost_usd for tr in outcome.tasks.values())
    launches = len(outcome.instances)
    counts = {
        "launches": launches,
        "spot_launches": sum(1 for i in outcome.instances.values() if i.capacity_type == "spot"),
        "on_demand_launches": sum(1 for i in outcome.instances.values() if i.capacity_type != "spot"),
        "fallbacks": sum(c.launch_errors for c in outcome.cycles),
        "preemptions": outcome.preemptions,
        "cycles": len(outcome.cycles),
        "failed_tasks": sum(1 for t in outcome.tasks.values() if t.state == "failed"),
    }
    report = summarize(task_results, span_list, used_gpu_s=used, lost_usd=lost, counts=counts)
    monthly = monthly_spend(outcome, span_list)
    limits = budgets(policy_dir)
    frozen = frozen_seconds(outcome)
    weights = outcome.cycles[-1].weights if outcome.cycles else {}
    teams = outcome.workload.teams
    total_w = sum(weights.get(t, 1.0) for t in teams) or 1.0
    total_gpu_s = sum(outcome.team_gpu_s.values()) or 1.0
    for team in sorted(set(report["teams"]) | set(teams)):
        entry = report["teams"].setdefault(team, {"cost_usd": 0.0, "waits_s": {}, "tasks": 0})
        by_month = monthly.get(team, {})
        entry["spend_by_month_usd"] = {m: round(v, 2) for m, v in sorted(by_month.items())}
        if team in limits:
            usd, kind = limits[team]
            top = max(by_month.values(), default=0.0)
            entry["budget"] = {
                "monthly_usd": usd,
                "kind": kind,
                "max_pct_of_budget": round(100 * top / usd, 2) if usd else None,
                "frozen_s": round(frozen.get(team, 0.0), 1),
                "within_hard_budget": kind != "hard" or top <= usd + 1e-6,
            }
        if team in teams:
            entry["fair_share"] = {
                "gpu_share": round(outcome.team_gpu_s.get(team, 0.0) / total_gpu_s, 4),
                "weight_share": round(weights.get(team, 1.0) / total_w, 4),
            }
    report["alerts"] = alert_sequence(outcome)
    return report
