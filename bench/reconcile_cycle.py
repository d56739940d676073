"""Benchmark: one reconcile cycle's decision path (snapshot + policy + plan, no cloud I/O).

Builds a SQLite database with N pending tasks, M ready instances (each with a worker,
half of them busy), P fake pools and T teams, then times `Reconciler.observe`,
`Reconciler.evaluate` (the embedded Rego engine, in-process as the simulator runs it)
and `plan` over repeated runs. `--scale 10` multiplies every dimension by ten.

    .venv/bin/python bench/reconcile_cycle.py --runs 30
    .venv/bin/python bench/reconcile_cycle.py --runs 10 --scale 10 --policy none
    .venv/bin/python bench/reconcile_cycle.py --runs 30 --input realistic
    .venv/bin/python bench/reconcile_cycle.py --runs 30 --gc-freeze

The full collections (generation 2) it prints are counted and timed with `gc.callbacks`
during the timed phases only.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import insert

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, PolicyConfig
from autoscaler.planner import plan
from autoscaler.policy.schema import Decision
from autoscaler.policy.service import PolicyService
from autoscaler.provisioning import catalog_offerings
from autoscaler.queueing.queues import sync_from_config
from autoscaler.reconciler.cycle import Reconciler
from autoscaler.state.db import make_engine, session_factory, transaction, upgrade
from autoscaler.state.models import Instance, Task, Worker
from providers.fake import FakeProvider

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


def build_config(pools: int, teams: int, queues: int) -> AutoscalerConfig:
    return AutoscalerConfig.model_validate(
        {
            "deployment": "bench",
            "teams": [{"name": f"team{t}"} for t in range(teams)],
            "pools": [
                {
                    "name": f"pool{p}",
                    "provider": "fake",
                    "max_instances": 100,
                    "zones": ["a", "b"],
                    "instance_types": [
                        {
                            "name": "g.1",
                            "gpus": 1,
                            "gpu_type": "A10G",
                            "on_demand_price": 1.0 + p / 100,
                            "spot_price": 0.4,
                        },
                        {"name": "g.4", "gpus": 4, "gpu_type": "A10G", "on_demand_price": 3.5, "spot_price": 1.5},
                        {"name": "g.8", "gpus": 8, "gpu_type": "A100", "on_demand_price": 30.0, "spot_price": 12.0},
                    ],
                }
                for p in range(pools)
            ],
            "queues": [
                {"name": f"q{q}", "pools": [f"pool{(q * 5 + k) % pools}" for k in range(5)]} for q in range(queues)
            ],
        }
    )


def team_shapes(teams: list[str], queues: list[str], rng: random.Random) -> dict[str, list[tuple[str, int, int]]]:
    """The realistic input's backlog: each team submits 2-4 shapes (queue, GPUs,
    priority), as a team runs a few kinds of job, not every combination."""
    return {
        t: [(rng.choice(queues), rng.choice([1, 1, 2, 4, 8]), rng.randint(0, 1)) for _ in range(rng.randint(2, 4))]
        for t in teams
    }


def populate(
    url: str, config: AutoscalerConfig, tasks: int, instances: int, rng: random.Random, *, realistic: bool = False
) -> None:
    engine = make_engine(url)
    upgrade(engine)
    sessions = session_factory(engine)
    teams = [t.name for t in config.teams]
    queues = [q.name for q in config.queues]
    # Drawn only for the realistic input, so the worst case keeps its draws from before.
    shapes = team_shapes(teams, queues, rng) if realistic else {}
    with transaction(sessions) as s:
        sync_from_config(s, config, now=NOW)
        rows = []
        for i in range(tasks):
            at = NOW - timedelta(seconds=rng.randint(0, 3600))
            if realistic:
                team = rng.choice(teams)
                queue, gpus, priority = rng.choice(shapes[team])
            else:
                # The worst case: every task drawn uniformly over every combination.
                queue, team, gpus, priority = (
                    rng.choice(queues),
                    rng.choice(teams),
                    rng.choice([0, 1, 1, 1, 2, 4, 8]),
                    rng.randint(0, 2),
                )
            rows.append(
                dict(
                    id=f"t{i:07d}",
                    queue=queue,
                    team=team,
                    command=["x"],
                    env={},
                    gpus=gpus,
                    priority=priority,
                    state="queued",
                    sort_key=at,
                    created_at=at,
                    updated_at=at,
                    gpu_indices=[],
                )
            )
        s.execute(insert(Task), rows)
        inst_rows, worker_rows, busy_rows = [], [], []
        for i in range(instances):
            pool = config.pools[i % len(config.pools)]
            wid = f"w{i:07d}"
            busy = i % 2 == 0
            inst_rows.append(
                dict(
                    id=f"i{i:07d}",
                    request_id=f"r{i:07d}",
                    provider="fake",
                    pool=pool.name,
                    instance_type="g.1",
                    capacity_type="spot",
                    gpus=1,
                    gpu_type="A10G",
                    provider_instance_id=f"p{i:07d}",
                    state="ready",
                    team=rng.choice(teams),
                    hourly_price=0.4,
                    worker_id=wid,
                    created_at=NOW,
                    updated_at=NOW,
                    launched_at=NOW - timedelta(hours=1),
                )
            )
            worker_rows.append(
                dict(
                    id=wid,
                    hostname="h",
                    instance_id=f"p{i:07d}",
                    provider="fake",
                    pool=pool.name,
                    state="busy" if busy else "idle",
                    gpus=[{"index": 0}],
                    gpu_count=1,
                    gpu_type="A10G",
                    registered_at=NOW,
                    last_heartbeat=NOW,
                    gpu_metrics=[],
                    idle_since=None if busy else NOW - timedelta(seconds=30),
                )
            )
            if busy:
                busy_rows.append(
                    dict(
                        id=f"b{i:07d}",
                        queue=queues[0],
                        team=rng.choice(teams),
                        command=["x"],
                        env={},
                        gpus=1,
                        state="running",
                        worker_id=wid,
                        sort_key=NOW,
                        created_at=NOW,
                        updated_at=NOW,
                        gpu_indices=[0],
                        attempts=1,
                    )
                )
        s.execute(insert(Instance), inst_rows)
        s.execute(insert(Worker), worker_rows)
        s.execute(insert(Task), busy_rows)
    engine.dispose()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=1)
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--input",
        choices=["worst", "realistic"],
        default="worst",
        help="worst: tasks uniform over every queue x team x size x priority (thousands of shapes); "
        "realistic: each team submits 2-4 shapes",
    )
    ap.add_argument(
        "--policy",
        choices=["embedded", "none"],
        default="embedded",
        help="none: skip the engine and plan with the permissive default decision "
        "(times snapshot + plan only; reported as such)",
    )
    ap.add_argument(
        "--gc-freeze",
        action="store_true",
        help="gc.freeze() what start-up built before the timed runs (what the simulator does), "
        "so full collections scan only what the cycles allocate",
    )
    args = ap.parse_args()
    n_tasks, n_inst, n_pools, n_teams = 10_000 * args.scale, 1_000 * args.scale, 50 * args.scale, 20 * args.scale
    rng = random.Random(args.seed)
    config = build_config(n_pools, n_teams, queues=max(n_pools // 5, 1))
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        t = time.perf_counter()
        populate(url, config, n_tasks, n_inst, rng, realistic=args.input == "realistic")
        print(
            f"populated {n_tasks} tasks, {n_inst} instances, {n_pools} pools, {n_teams} teams "
            f"in {time.perf_counter() - t:.1f} s"
        )
        engine = make_engine(url)
        clock = ManualClock(NOW)
        providers = {
            p.name: FakeProvider(catalog_offerings(p), clock=clock.now, record_calls=False) for p in config.pools
        }
        policy = PolicyService(PolicyConfig(), isolate=False)
        rec = Reconciler(session_factory(engine), config, clock, providers, policy)
        rec._refresh_offerings(NOW)
        phases: dict[str, list[float]] = {"snapshot": [], "policy": [], "plan": [], "total": []}
        # CPU time of this process next to wall time: on a shared machine the wall
        # clock also counts waiting for a core, the CPU time does not.
        cpu: dict[str, list[float]] = {name: [] for name in phases}
        launches = 0
        # Time spent in the collector's full (generation 2) passes during the timed
        # phases: they scan every tracked object of the process, so they grow with the
        # heap, not with what the cycle allocates.
        full_gc: list[float] = []
        started: list[float] = []

        def on_gc(phase: str, info: dict[str, int]) -> None:
            if info["generation"] != 2:
                return
            if phase == "start":
                started.append(time.perf_counter())
            elif started:
                full_gc.append(time.perf_counter() - started.pop())

        if args.gc_freeze:
            gc.collect()
            gc.freeze()
        gc.callbacks.append(on_gc)
        for _ in range(args.runs):
            t0, c0 = time.perf_counter(), time.process_time()
            snap = rec.observe(NOW)
            t1, c1 = time.perf_counter(), time.process_time()
            decision = rec.evaluate(snap).decision if args.policy == "embedded" else Decision()
            t2, c2 = time.perf_counter(), time.process_time()
            p = plan(snap.plan_input(decision))
            t3, c3 = time.perf_counter(), time.process_time()
            launches = len(p.launches)
            for name, v, c in (
                ("snapshot", t1 - t0, c1 - c0),
                ("policy", t2 - t1, c2 - c1),
                ("plan", t3 - t2, c3 - c2),
                ("total", t3 - t0, c3 - c0),
            ):
                phases[name].append(v * 1000)
                cpu[name].append(c * 1000)
            del snap, p  # the next run's garbage collections should not scan this one's
        gc.callbacks.remove(on_gc)
        tracked = len(gc.get_objects())
        policy.close()
        engine.dispose()
    print(
        f"runs={args.runs} input={args.input} policy={args.policy} gc_freeze={args.gc_freeze} "
        f"launches planned per cycle={launches}"
    )
    print(
        f"full collections: {len(full_gc)} in {args.runs} runs, {sum(full_gc) * 1000:.0f} ms in all "
        f"(median {statistics.median(full_gc) * 1000 if full_gc else 0:.1f} ms each); tracked objects {tracked}"
    )
    print(f"{'phase':<10}{'median ms':>12}{'p99 ms':>10}{'cpu median ms':>16}")
    for name, values in phases.items():
        print(
            f"{name:<10}{statistics.median(values):>12.1f}{pct(values, 0.99):>10.1f}"
            f"{statistics.median(cpu[name]):>16.1f}"
        )


if __name__ == "__main__":
    main()
