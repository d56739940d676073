"""Our system's figures from one simulation: the common summary (cost, GPU-hours,
waits, counts) plus what only a policy-driven loop has: budget adherence per team
(highest % of a monthly budget, time frozen), the alert sequence, fair share (GPU
share against weight share), and gangs apart (`gang_figures`: their waits, and the
GPU-hours their reservations held before the ranks started)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select

from autoscaler.ledger import accrue, by_month, shared_pools
from autoscaler.policy.bundle import shipped_policy_dir
from autoscaler.queueing import gangs
from autoscaler.sim.budgets import read_budgets
from autoscaler.sim.engine import SimOutcome
from autoscaler.sim.summary import Span, TaskResult, summarize, waits
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, TaskRank


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


def _utc(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def monthly_spend(outcome: SimOutcome) -> dict[str, dict[str, float]]:
    """team -> {YYYY-MM: USD}, from the ledger itself (the code path that feeds the
    policy, the dashboard and `/metrics`), accrued up to the end of the run: each
    machine's cost split among the teams whose tasks held its GPUs, the rest to the
    launching team or "shared"."""
    end = outcome.settings.start + timedelta(seconds=outcome.end_s)
    with transaction(outcome.sessions) as s:
        # From the run's start: a one-off at the end, so every machine of the run is
        # brought up to its end (cycles accrued all but the last stretch already).
        accrue(s, now=end, since=outcome.settings.start, shared=shared_pools(outcome.config))
        return by_month(s)


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
                tr.trace.work_gpu_s,
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
    monthly = monthly_spend(outcome)
    team_costs = {t: sum(m.values()) for t, m in monthly.items()}
    report = summarize(task_results, span_list, used_gpu_s=used, lost_usd=lost, counts=counts, team_costs=team_costs)
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
    report["gangs"] = gang_figures(outcome, task_results)
    return report


def gang_figures(outcome: SimOutcome, results: list[TaskResult]) -> dict[str, Any]:
    """Gangs apart from single tasks: how many, their waits (a gang waits for all N
    machines at once, so its waits are not the single tasks'), and the GPU-hours their
    ranks held reserved before starting: from each rank's reservation to its start, or
    to its release (a timeout, a lost worker), or to the end of the run. Those hours are
    paid (charged to the gang's team) and run nothing."""
    is_gang = [tr.trace.nodes > 1 for tr in outcome.tasks.values()]
    gang_results = [r for r, g in zip(results, is_gang, strict=True) if g]
    end = outcome.settings.start + timedelta(seconds=outcome.end_s)
    held_s = 0.0
    released = 0
    with outcome.sessions() as s:
        for gpus, reserved, started, ended, reason in s.execute(
            select(
                TaskRank.gpu_indices, TaskRank.reserved_at, TaskRank.started_at, TaskRank.ended_at, TaskRank.end_reason
            )
        ):
            until = started or ended or end
            held_s += len(gpus or []) * max((_utc(until) - _utc(reserved)).total_seconds(), 0.0)
            released += int(started is None and reason == gangs.TIMED_OUT)
    return {
        "tasks": len(gang_results),
        "succeeded": sum(r.done for r in gang_results),
        "waits_s": waits([r.wait_s for r in gang_results]),
        "reservation_gpu_hours": round(held_s / 3600.0, 3),
        "reservations_timed_out": released,
    }
