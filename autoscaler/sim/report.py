"""What `autoscaler simulate` writes: `report.json` (ours, the lower bound and the
baselines in one shape), `report.md` (the comparison table) and PNG plots (fleet size
and queue depth over time; spend against budget per team)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoscaler.sim import baselines, bounds, gap, managed_spot, metrics
from autoscaler.sim.engine import SimOutcome


def build(outcome: SimOutcome, policy_dir: Path | None) -> dict[str, Any]:
    wl, cfg, st = outcome.workload, outcome.config, outcome.settings
    ours = metrics.ours(outcome, policy_dir)
    lower = baselines.lower_bound(wl, cfg)
    aware = bounds.reclaim_aware_bound(wl, cfg, st)
    aware_usd = float(aware["usd"])
    report: dict[str, Any] = {
        "workload": {"name": wl.name, "tasks": len(wl.tasks), "teams": list(wl.teams), "notes": list(wl.notes)},
        "settings": {
            "seed": st.seed,
            "boot_delay_s": list(st.boot_delay_s),
            "preemption_per_hour": st.preemption_per_hour,
            "preemption_by_zone": dict(sorted(st.preemption_by_zone.items())),
            "checkpoint_every_s": st.checkpoint_every_s,
            "checkpoints_share": st.checkpoints_share,
            "expected_runtime_known": st.expected_runtime_known,
            "reconcile_interval_s": cfg.reconcile.interval_s,
            "pools": [p.name for p in cfg.pools],
            # Only when set (`--wait-target`), so a default run's report is as before.
            **({"wait_target_s": cfg.capacity.wait_target_s} if cfg.capacity.wait_target_s is not None else {}),
            **({"standby": False} if not cfg.capacity.standby else {}),
            **({"standby_scope": cfg.capacity.standby_scope} if cfg.capacity.standby_scope != "shared" else {}),
            # Likewise only when a pool keeps idle machines other than the default 300 s.
            **(
                {"idle_timeout_s": sorted({p.idle_timeout_s for p in cfg.pools})}
                if any(p.idle_timeout_s != 300.0 for p in cfg.pools)
                else {}
            ),
            **(
                {"warm_pool": sorted({p.warm_pool for p in cfg.pools})}
                if any(p.warm_pool != "adaptive" for p in cfg.pools)
                else {}
            ),
        },
        "simulation": {
            "wall_s": round(outcome.wall_s, 2),
            "virtual_days": round(outcome.end_s / 86400, 2),
            "cycles": len(outcome.cycles),
        },
        **ours,
        "lower_bound_usd": lower,
        "lower_bound_work_gpu_hours": round(sum(t.work_gpu_s for t in wl.tasks) / 3600, 1),
        "cost_vs_lower_bound": round(ours["total_cost_usd"] / lower, 3) if lower else None,
        "reclaim_aware_bound": aware,
        "cost_vs_reclaim_aware_bound": round(ours["total_cost_usd"] / aware_usd, 3) if aware_usd else None,
        # Where ours spends above that bound, by cause (autoscaler.sim.gap).
        "gap_to_reclaim_aware_bound": gap.decompose(
            outcome.sessions, wl, cfg, st, outcome.end_s, {tid: t.lost_usd for tid, t in outcome.tasks.items()}
        ),
        "baselines": {
            "managed_spot": managed_spot.managed_spot(wl, cfg, st),
            "clearml_style": baselines.clearml_style(wl, cfg, st),
            "static_fleet": baselines.static_fleet(wl, cfg),
        },
    }
    return report


def markdown(report: dict[str, Any]) -> str:
    lb = report["lower_bound_usd"]
    # Reports written before the reclaim-aware bound existed have none.
    ra = (report.get("reclaim_aware_bound") or {}).get("usd")
    rows = [("ours", report), *report["baselines"].items()]
    lines = [
        f"# Simulation: {report['workload']['name']}",
        "",
        f"{report['workload']['tasks']} tasks, {len(report['workload']['teams'])} teams; "
        f"{report['simulation']['virtual_days']} virtual days in {report['simulation']['wall_s']} s "
        f"({report['simulation']['cycles']} reconcile cycles).",
        "",
        "| system | cost USD | x lower bound | x reclaim-aware bound | tasks finished | USD per finished GPU-h | wait p50 | wait p95 "
        "| wait p99 | GPU-h used | GPU-h idle | GPU-h booting | lost to preemption USD | launches | preemptions |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| lower bound (spot, no reclaim) | {lb:,.2f} | 1.00 | {_ratio(lb, ra)} | all "
        f"| {_per_h(lb, report['lower_bound_work_gpu_hours'])} | 0 | 0 | 0 | | 0 | 0 | 0 | | |",
    ]
    if ra is not None:
        lines.append(
            f"| reclaim-aware bound | {ra:,.2f} | {_ratio(ra, lb)} | 1.00 | all "
            f"| {_per_h(ra, report['lower_bound_work_gpu_hours'])} | 0 | 0 | 0 | | 0 | 0 | 0 | | |"
        )
    for name, r in rows:
        w, g, c, t = r["waits_s"], r["gpu_hours"], r["counts"], r["tasks"]
        lines.append(
            f"| {name} | {r['total_cost_usd']:,.2f} | {_ratio(r['total_cost_usd'], lb)} "
            f"| {_ratio(r['total_cost_usd'], ra)} | {t['succeeded']}/{t['total']} "
            f"| {_per_h(r['total_cost_usd'], r['completed_work_gpu_hours'])} | {_dur(w['p50'])} | {_dur(w['p95'])} "
            f"| {_dur(w['p99'])} | {g['used']:,.1f} | {g['idle']:,.1f} | {g['booting']:,.1f} "
            f"| {r['lost_to_preemption_usd']:,.2f} | {c.get('launches', 0)} | {c.get('preemptions', 0)} |"
        )
    gangs = report.get("gangs")  # reports written before gangs were simulated have none
    if gangs and gangs["tasks"]:
        w = gangs["waits_s"]
        lines += [
            "",
            f"Gangs (ours): {gangs['succeeded']}/{gangs['tasks']} finished; wait p50 {_dur(w['p50'])}, "
            f"p95 {_dur(w['p95'])}; reservations held {gangs['reservation_gpu_hours']:,.1f} GPU-h before their "
            f"ranks started ({gangs['reservations_timed_out']} rank reservation(s) released at the timeout).",
        ]
    lines += _gap_lines(report.get("gap_to_reclaim_aware_bound"))
    lines += [
        "",
        "## Teams (ours)",
        "",
        "| team | cost USD | wait p95 | max % of budget | frozen | GPU share | weight share |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for team, t in sorted(report["teams"].items()):
        b = t.get("budget") or {}
        fs = t.get("fair_share") or {}
        lines.append(
            f"| {team} | {t['cost_usd']:,.2f} | {_dur(t['waits_s'].get('p95', 0))} "
            f"| {b.get('max_pct_of_budget', '-')} | {_dur(b['frozen_s']) if b else '-'} "
            f"| {fs.get('gpu_share', '-')} | {fs.get('weight_share', '-')} |"
        )
    if report["workload"]["notes"]:
        lines += ["", "Notes: " + "; ".join(report["workload"]["notes"]) + "."]
    return "\n".join(lines) + "\n"


def _gap_lines(g: dict[str, Any] | None) -> list[str]:
    """Where ours spends above the reclaim-aware bound (reports from before have none)."""
    if not g:
        return []
    lines = [
        "",
        f"## Gap to the reclaim-aware bound (ours): {g['gap_usd']:,.2f} USD",
        "",
        "| part | USD | share of the gap |",
        "|---|---:|---:|",
    ]
    for part, usd in g["parts_usd"].items():
        share = f"{100 * usd / g['gap_usd']:.1f} %" if g["gap_usd"] else "-"
        lines.append(f"| {part} | {usd:,.2f} | {share} |")
    return lines


def _ratio(usd: float, bound: float | None) -> str:
    return f"{usd / bound:.2f}" if bound else "-"


def _per_h(usd: float, gpu_hours: float) -> str:
    return f"{usd / gpu_hours:.2f}" if gpu_hours else "-"


def _dur(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def plots(outcome: SimOutcome, report: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    written: list[Path] = []
    days = [s.t_s / 86400 for s in outcome.samples]
    fig, ax = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax[0].step(days, [s.gpus for s in outcome.samples], where="post", label="GPUs in the fleet")
    ax[0].step(days, [s.instances for s in outcome.samples], where="post", label="instances")
    ax[0].set_ylabel("fleet")
    ax[0].legend(loc="upper right")
    ax[1].step(days, [s.queued for s in outcome.samples], where="post", color="tab:red", label="queued tasks")
    ax[1].step(days, [s.running for s in outcome.samples], where="post", color="tab:green", label="running tasks")
    ax[1].set_ylabel("tasks")
    ax[1].set_xlabel("virtual days")
    ax[1].legend(loc="upper right")
    fig.suptitle(f"Fleet and queue: {report['workload']['name']}")
    fig.tight_layout()
    path = out_dir / "fleet_and_queue.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    fig = spend_figure(report)
    path = out_dir / "spend_vs_budget.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    return written


def team_colours(n: int) -> list[Any]:
    """n distinguishable colours: tab10/tab20 while they last, then evenly spaced hues
    (a palette reused in a cycle would give two teams one colour)."""
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["hsv"](i / n) for i in range(n)]


def spend_figure(report: dict[str, Any]) -> Any:
    """Spend per team and month as grouped bars, each team's budget a dashed mark over
    its own bars. Months are separate totals, so bars, not a line joining them."""
    import matplotlib.pyplot as plt

    teams = [(team, t) for team, t in sorted(report["teams"].items()) if t.get("spend_by_month_usd")]
    months = sorted({m for _, t in teams for m in t["spend_by_month_usd"]})
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.8 / max(len(teams), 1)
    for i, ((team, t), colour) in enumerate(zip(teams, team_colours(len(teams)), strict=True)):
        xs = [months.index(m) + (i - (len(teams) - 1) / 2) * width for m in t["spend_by_month_usd"]]
        ax.bar(xs, list(t["spend_by_month_usd"].values()), width=width, color=colour, label=team)
        b = t.get("budget")
        if b:
            ax.hlines(
                [b["monthly_usd"]] * len(xs),
                [x - width / 2 for x in xs],
                [x + width / 2 for x in xs],
                colors=[colour],
                linestyles="dashed",
                label=f"{team} {b['kind']} budget",
            )
    ax.set_xticks(range(len(months)), months)
    ax.set_ylabel("USD per month")
    ax.set_title("Spend per team and month vs budget (dashed: budget)")
    if teams:
        ax.legend(fontsize="small", ncol=3)
    fig.tight_layout()
    return fig


def write(outcome: SimOutcome, report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out_dir / "report.md").write_text(markdown(report))
    return [out_dir / "report.json", out_dir / "report.md", *plots(outcome, report, out_dir)]
