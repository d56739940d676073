"""Evaluation time of the shipped policies at scale: 100 teams x 50 pools x 1,000 queues.

    .venv/bin/python bench/policy_eval.py [--runs 30] [--baseline DIR]

Prints the median and p99 of `PolicyService.evaluate` for the isolated engine (child
process, what the server runs) and in-process (what the simulator runs), the child
round-trip overhead on a tiny input, and how long rego-cpp takes just to read the
large input (`set_input_term`), which no policy change can remove.

`--baseline DIR` measures another policy directory in the same run, so before/after
figures share the machine's load (for example an earlier revision:
`git archive <rev> policies | tar -x -C /tmp/before`, then `--baseline /tmp/before/policies`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from autoscaler.config import PolicyConfig
from autoscaler.policy.cases import complete_input
from autoscaler.policy.engines import input_document
from autoscaler.policy.schema import PolicyInput
from autoscaler.policy.service import PolicyService


def big_input(teams: int, pools: int, queues: int, seed: int = 7) -> PolicyInput:
    rng = random.Random(seed)
    team_names = ["research", "prod-inference", "interns"] + [f"team-{i}" for i in range(teams - 3)]
    pool_rows = []
    for i in range(pools):
        static = i < 5
        pool_rows.append(
            {
                "name": f"pool-{i}",
                "provider": "static" if static else rng.choice(["aws", "gcp", "azure"]),
                "kind": "static" if static else "cloud",
                "region": rng.choice(["local", "us-east-1", "eu-west-1"]),
                "current_instances": rng.randint(0, 20),
                "max_instances": 40,
                "idle_instances": rng.randint(0, 3),
                "hourly_prices": {
                    f"t{i}/spot": round(rng.uniform(0.5, 30), 2),
                    f"t{i}/on_demand": round(rng.uniform(1, 90), 2),
                },
            }
        )
    return complete_input(
        {
            "now": "2026-03-16T00:00:00Z",
            "teams": [
                {
                    "name": n,
                    "month_to_date_usd": rng.uniform(0, 30000),
                    "forecast_usd": rng.uniform(0, 60000),
                    "burn_rate_usd_per_hour": rng.uniform(0, 50),
                    "running_gpus": rng.randint(0, 40),
                    "pending_gpus": rng.randint(0, 10),
                }
                for n in team_names
            ],
            "queues": [
                {
                    "name": f"q-{i}",
                    "pools": rng.sample([p["name"] for p in pool_rows], 3),
                    "depth": rng.randint(0, 30),
                    "teams_waiting": rng.sample(team_names, 2),
                    "pending_gpus_by_shape": {"1xA100": rng.randint(0, 8)},
                }
                for i in range(queues)
            ],
            "pools": pool_rows,
            "fleet": {"instances": 500},
        }
    )


def measure(service: PolicyService, policy_input: PolicyInput, runs: int, *, warm_up: bool = True) -> list[float]:
    if warm_up:
        service.evaluate(policy_input)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        result = service.evaluate(policy_input)
        times.append((time.perf_counter() - started) * 1000)
        assert result.error is None, result.error
    return times


def input_read_ms(policy_input: PolicyInput, runs: int) -> list[float]:
    """rego-cpp reading the input document alone: the floor under any policy."""
    from regopy import Interpreter

    text = json.dumps(input_document(policy_input))
    interp = Interpreter()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        interp.set_input_term(text)
        times.append((time.perf_counter() - started) * 1000)
    return times


def p99(xs: list[float]) -> float:
    return sorted(xs)[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--pools", type=int, default=50)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--baseline", type=Path, help="another policy directory to measure in the same run")
    args = parser.parse_args()
    big = big_input(args.teams, args.pools, args.queues)
    tiny = complete_input({"now": "2026-03-16T00:00:00Z", "teams": [{"name": "research"}]})
    print(
        f"input: {args.teams} teams x {args.pools} pools x {args.queues} queues, "
        f"{len(big.model_dump_json())} bytes of JSON; {args.runs} runs each"
    )
    dirs: list[tuple[str, str | None]] = [("shipped", None)]
    if args.baseline:
        dirs.insert(0, ("baseline", str(args.baseline)))
    rows: dict[tuple[str, str, str], list[float]] = {}
    for isolate in (True, False):
        mode = "isolated" if isolate else "in-process"
        services = {label: PolicyService(PolicyConfig(dir=d, timeout_s=120), isolate=isolate) for label, d in dirs}
        try:
            # Interleaved, one run of each directory in turn, so a load spike on a shared
            # machine hits before and after alike.
            for size, policy_input, runs in (("large", big, args.runs), ("tiny", tiny, args.runs * 10)):
                for label, service in services.items():
                    rows[(label, mode, size)] = []
                    service.evaluate(policy_input)  # warm-up
                for _ in range(runs):
                    for label, service in services.items():
                        rows[(label, mode, size)] += measure(service, policy_input, 1, warm_up=False)
        finally:
            for service in services.values():
                service.close()
    for (label, mode, size), xs in rows.items():
        print(f"{label:8s} {mode:10s} {size:5s} median {statistics.median(xs):9.2f} ms   p99 {p99(xs):9.2f} ms")
    read = input_read_ms(big, args.runs)
    print(f"rego-cpp reading the large input alone: median {statistics.median(read):.2f} ms")
    iso = statistics.median(rows[("shipped", "isolated", "tiny")])
    inproc = statistics.median(rows[("shipped", "in-process", "tiny")])
    print(f"child round-trip overhead on a tiny input: {iso - inproc:.2f} ms (ratio {iso / inproc:.2f}x)")
    big_ratio = statistics.median(rows[("shipped", "isolated", "large")]) / statistics.median(
        rows[("shipped", "in-process", "large")]
    )
    print(f"isolated / in-process on the large input: {big_ratio:.2f}x")


if __name__ == "__main__":
    main()
