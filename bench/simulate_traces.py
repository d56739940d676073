"""Simulator speed and cost/wait figures on the real traces (shared/data, read in place).

    .venv/bin/python bench/simulate_traces.py --workload philly:../shared/data/traces/philly-vc-gavel [--days D]
    .venv/bin/python bench/simulate_traces.py --workload alibaba:../shared/data/traces/alibaba-gpu-v2023/openb_pod_list_default.csv [--days D]
    ... [--seed S] [--checkpoint-every MIN] [--spot-only | --policy DIR]
    ... [--zone-rates] [--checkpoints-share P] [--idle-timeout S] [--warm-pool R]   # the CLI's world, its what-ifs
    ... --from-day F --days D   # a slice for speed work: arrivals in [F, F + D), from an empty fleet

Runs ours (the real reconciler, policy and queueing on the fake provider), the lower
bound and both baselines in one process, prints wall time, cycles, the gangs' figures
(waits, reservation GPU-hours) and the comparison table, and writes the report (json,
md, PNGs) under --out. The JSON line also gives the wall time per phase of the real
cycle (`phase_ms_per_cycle`: the cycle's own timings, `record` for the admission write
and decision record after `act`, `agents_and_events` for everything outside the cycle:
the simulated agents' calls and the event loop) and the CPU time of the run (start-up
included), which is the comparable figure on a loaded machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

from autoscaler.policy.bundle import shipped_policy_dir
from autoscaler.sim import report as sim_report
from autoscaler.sim.catalog import DEFAULT_ZONE_RATES, default_config
from autoscaler.sim.engine import SimSettings
from autoscaler.sim.runner import run_simulation
from autoscaler.sim.workload import Workload, load_workload


def from_day(wl: Workload, day: float) -> Workload:
    """The arrivals from `day` on, moved to start at 0 (a busy stretch measured without
    replaying the quiet days before it; the fleet starts empty, so its figures are a
    speed probe, not the trace's cost)."""
    if day <= 0:
        return wl
    cut = day * 86400.0
    kept = tuple(dataclasses.replace(t, arrival_s=t.arrival_s - cut) for t in wl.tasks if t.arrival_s >= cut)
    return dataclasses.replace(wl, name=f"{wl.name} (from day {day:g})", tasks=kept)


def spot_only_policy(target: Path) -> Path:
    """The shipped policies with `default: capacity: spot_only` in priorities.yaml (the
    shipped case that checks the default capacity is dropped: it tests the shipped data)."""
    target = target / "policies"
    shutil.copytree(shipped_policy_dir(), target)
    data = target / "data" / "priorities.yaml"
    doc = yaml.safe_load(data.read_text())
    doc["default"]["capacity"] = "spot_only"
    data.write_text(yaml.safe_dump(doc))
    (target / "tests" / "priorities.yaml").unlink()
    return target


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--days", type=float, default=None)
    ap.add_argument(
        "--from-day",
        type=float,
        default=0.0,
        help="speed work: drop arrivals before this day (then --days counts from it)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preemption-rate", type=float, default=SimSettings.preemption_per_hour)
    ap.add_argument("--checkpoint-every", type=float, default=None, help="minutes; 0 = only when told to stop")
    ap.add_argument(
        "--zone-rates",
        action="store_true",
        help="the default world's per-zone reclaim rates, as `autoscaler simulate` uses them "
        "(without it every zone gets --preemption-rate, 0.24 by default)",
    )
    ap.add_argument("--checkpoints-share", type=float, default=0.0, help="what-if: this share of tasks checkpoints")
    ap.add_argument("--idle-timeout", type=float, default=None, help="what-if: every pool's idle_timeout_s")
    ap.add_argument(
        "--warm-pool", choices=("adaptive", "fixed"), default=None, help="what-if: every pool's warm_pool rule"
    )
    ap.add_argument("--policy", type=Path, default=None)
    ap.add_argument(
        "--spot-only",
        action="store_true",
        help="what-if: the shipped policies with the default team spot-only, i.e. every trace team "
        "(reclaimed work stays on spot)",
    )
    ap.add_argument("--out", type=Path, default=Path("bench-out"))
    args = ap.parse_args()
    t0 = time.perf_counter()
    wl = from_day(load_workload(args.workload), args.from_day).first_days(args.days)
    load_s = time.perf_counter() - t0
    cfg = default_config(wl.teams)
    if args.idle_timeout is not None:
        cfg = cfg.model_copy(
            update={"pools": [p.model_copy(update={"idle_timeout_s": args.idle_timeout}) for p in cfg.pools]}
        )
    if args.warm_pool is not None:
        cfg = cfg.model_copy(update={"pools": [p.model_copy(update={"warm_pool": args.warm_pool}) for p in cfg.pools]})
    started = time.perf_counter()
    last_print = [started]

    def progress(done_s: float, expected_s: float) -> None:
        # A run stopped by `timeout` still leaves how far it got (virtual days per wall
        # second), which is what a speed extrapolation needs.
        now = time.perf_counter()
        if now - last_print[0] >= 15.0:
            last_print[0] = now
            wall = now - started
            print(
                f"progress: {done_s / 86400:.2f} virtual days in {wall:.0f} s wall "
                f"({done_s / 86400 / wall:.3f} days/s; {expected_s / 86400:.1f} days expected)",
                file=sys.stderr,
                flush=True,
            )

    if args.spot_only:
        args.policy = spot_only_policy(Path(tempfile.mkdtemp(prefix="spot-only-")))
    # Collections during the run, timed (the full ones walk the whole tracked heap).
    gc_s = {0: 0.0, 1: 0.0, 2: 0.0}
    gc_n = {0: 0, 1: 0, 2: 0}
    gc_t = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_t[0] = time.perf_counter()
        else:
            gc_s[info["generation"]] += time.perf_counter() - gc_t[0]
            gc_n[info["generation"]] += 1

    gc.callbacks.append(on_gc)
    checkpoint_s = None if args.checkpoint_every is None else args.checkpoint_every * 60.0
    settings = SimSettings(
        seed=args.seed,
        preemption_per_hour=args.preemption_rate,
        preemption_by_zone=DEFAULT_ZONE_RATES if args.zone_rates else {},
        checkpoint_every_s=checkpoint_s,
        checkpoints_share=args.checkpoints_share,
    )
    cpu0 = time.process_time()
    outcome = run_simulation(wl, cfg, policy_dir=args.policy, settings=settings, progress=progress)
    cpu_s = time.process_time() - cpu0
    gc.callbacks.remove(on_gc)
    t1 = time.perf_counter()
    rep = sim_report.build(outcome, args.policy)
    report_s = time.perf_counter() - t1
    sim_report.write(outcome, rep, args.out)
    print(
        json.dumps(
            {
                "tasks": len(wl.tasks),
                "load_s": round(load_s, 2),
                "sim_wall_s": round(outcome.wall_s, 1),
                "cycles": len(outcome.cycles),
                "ms_per_cycle": round(1000 * outcome.wall_s / max(len(outcome.cycles), 1), 1),
                "sim_cpu_s": round(cpu_s, 1),
                "phase_ms_per_cycle": phase_ms(outcome.phases_s, outcome.wall_s, len(outcome.cycles)),
                "virtual_days": round(outcome.end_s / 86400, 2),
                "report_and_baselines_s": round(report_s, 2),
                "gc_collections": [gc_n[g] for g in range(3)],
                "gc_s": [round(gc_s[g], 2) for g in range(3)],
                "gangs": rep["gangs"],
            }
        )
    )
    print(sim_report.markdown(rep))


def phase_ms(phases_s: dict[str, float], wall_s: float, cycles: int) -> dict[str, float]:
    out = {k: round(1000 * v / max(cycles, 1), 1) for k, v in sorted(phases_s.items()) if k != "cycles"}
    out["agents_and_events"] = round(1000 * (wall_s - phases_s.get("cycles", 0.0)) / max(cycles, 1), 1)
    return out


if __name__ == "__main__":
    main()
