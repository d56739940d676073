"""Evaluation time of the shipped policies at scale: 100 teams x 50 pools x 1,000 queues.

    .venv/bin/python bench/policy_eval.py [--runs 30] [--baseline DIR]

Prints the median and p99 of `PolicyService.evaluate` for the isolated engine (child
process, what the server runs) and in-process (what the simulator runs), the child
round-trip overhead on a tiny input, and how long rego-cpp takes just to read the
large input (`set_input_term`). `--breakdown` times each step of one evaluation
alone (building and serialising the input, the engine reading it, the rules, reading
the answer back, the owner-thread and child-process hops).

`--baseline DIR` measures another policy directory in the same run, so before/after
figures share the machine's load (for example an earlier revision:
`git archive <rev> policies | tar -x -C /tmp/before`, then `--baseline /tmp/before/policies`).

`--previous TREE` measures a whole other tree (code, engine and policies) side by side
with this one, in one run: each tree evaluates in its own worker process (this script
with `--worker`, its imports resolved in that tree), the driver alternates single runs
between them, prints medians and ratios, and checks the two trees' decisions on the
large input agree (floats to 12 significant digits: rego-cpp prints 15-16):

    rm -rf /tmp/prev && mkdir /tmp/prev && git archive HEAD~1 | tar -x -C /tmp/prev
    .venv/bin/python bench/policy_eval.py --previous /tmp/prev --runs 20
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

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


# ------------------------------------------------------------------ two trees side by side


def normalized(value: Any) -> Any:
    """A decision with floats to 12 significant digits, for comparing across interpreters."""
    if isinstance(value, dict):
        return {k: normalized(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if isinstance(value, float):
        return float(f"{value:.12g}")
    return value


def worker(teams: int, pools: int, queues: int) -> None:
    """One tree's side: answers `<mode> <size>` lines with the ms of one evaluation."""
    big = big_input(teams, pools, queues)
    tiny = complete_input({"now": "2026-03-16T00:00:00Z", "teams": [{"name": "research"}]})
    inputs = {"large": big, "tiny": tiny}
    services = {
        mode: PolicyService(PolicyConfig(timeout_s=120), isolate=mode == "isolated")
        for mode in ("isolated", "in-process")
    }
    for service in services.values():
        for policy_input in inputs.values():
            service.evaluate(policy_input)  # warm-up
    decision = services["in-process"].evaluate(big).decision.model_dump(mode="json")
    print(json.dumps({"ready": True, "decision": normalized(decision)}), flush=True)
    for line in sys.stdin:
        mode, size = line.split()
        print(json.dumps(measure(services[mode], inputs[size], 1, warm_up=False)[0]), flush=True)
    for service in services.values():
        service.close()


def side_by_side(previous: Path, runs: int, teams: int, pools: int, queues: int) -> None:
    here = Path(__file__).resolve().parents[1]
    trees = {"previous": previous.resolve(), "this": here}
    procs = {}
    for label, tree in trees.items():
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker"]
        cmd += ["--teams", str(teams), "--pools", str(pools), "--queues", str(queues)]
        procs[label] = subprocess.Popen(
            cmd, cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
    decisions = {}
    for label, proc in procs.items():
        assert proc.stdout is not None
        decisions[label] = json.loads(proc.stdout.readline())["decision"]
    same = decisions["previous"] == decisions["this"]
    print(f"input: {teams} teams x {pools} pools x {queues} queues; {runs} runs each, trees alternated")
    print(f"decisions on the large input: {'the same' if same else 'DIFFERENT'} in both trees")
    rows: dict[tuple[str, str, str], list[float]] = {}
    for mode in ("isolated", "in-process"):
        for size, n in (("large", runs), ("tiny", runs * 10)):
            for _ in range(n):
                for label, proc in procs.items():
                    assert proc.stdin is not None and proc.stdout is not None
                    proc.stdin.write(f"{mode} {size}\n")
                    proc.stdin.flush()
                    rows.setdefault((mode, size, label), []).append(float(proc.stdout.readline()))
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(f"{'mode':10s} {'input':5s} {'previous':>12s} {'this':>12s} {'ratio':>8s}   (medians; p99 this)")
    for mode in ("isolated", "in-process"):
        for size in ("large", "tiny"):
            before = statistics.median(rows[(mode, size, "previous")])
            after = statistics.median(rows[(mode, size, "this")])
            tail = p99(rows[(mode, size, "this")])
            print(f"{mode:10s} {size:5s} {before:9.2f} ms {after:9.2f} ms {before / after:7.1f}x   p99 {tail:.2f} ms")
    if not same:
        raise SystemExit("the two trees decided differently on the large input")


def breakdown(teams: int, pools: int, queues: int, runs: int = 9) -> None:
    """The steps of one evaluation, each timed alone (medians of wall and of this
    thread's CPU time), on the data the service
    loads by default (`policies/data/`, what the rest of this bench evaluates), for the
    large input and the one-team input."""
    import regorus

    from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
    from autoscaler.policy.engines import derived_input, input_text, text_digest, to_decision
    from autoscaler.policy.input_fields import InputSelection
    from autoscaler.policy.isolation import IsolatedRego
    from autoscaler.policy.regorus_runtime import RegorusRuntime

    bundle = load_bundle(shipped_policy_dir())
    engine = regorus.Engine()
    for rel, source in sorted(bundle.modules.items()):
        engine.add_policy(rel, source)
    engine.add_data(bundle.data)
    selection = InputSelection.for_policy(bundle.modules, bundle.data)
    runtime = RegorusRuntime()
    runtime.load(bundle.modules, bundle.data, "autoscaler/decision")
    child = IsolatedRego(120.0)
    child.load(bundle.modules, bundle.data, "autoscaler/decision")
    rule = "data.autoscaler.decision"
    tiny = complete_input({"now": "2026-03-16T00:00:00Z", "teams": [{"name": "research"}]})
    try:
        for size, policy_input in (("large", big_input(teams, pools, queues)), ("tiny", tiny)):
            names = [t.name for t in policy_input.teams]
            text = input_text(policy_input, selection)
            engine.set_input_json(text)
            out = engine.eval_rule_as_json(rule)
            print(
                f"{size}: {len(text)} bytes of JSON handed to the engine ({len(input_text(policy_input))} with every field)"
            )
            steps = {
                "derived_input (joins, pools by price)": lambda p=policy_input: derived_input(p),
                "input_text (derived_input + pydantic dump, trimmed)": lambda p=policy_input: input_text(p, selection),
                "text_digest (sha256 of the text)": lambda t=text: text_digest(t),
                "regorus set_input_json": lambda t=text: engine.set_input_json(t),
                f"regorus eval_rule_as_json({rule})": lambda: engine.eval_rule_as_json(rule),
                "json.loads of the answer": lambda o=out: json.loads(o),
                "to_decision (validation)": lambda o=out, n=names: to_decision(json.loads(o), n),
                "in-process runtime: set + eval + loads, owner thread": lambda t=text: runtime.evaluate_text(t),
                "isolated: the same through the child process": lambda t=text: child.evaluate_text(t),
            }
            if size == "large":
                rules = ("teams", "team_facts", "team_reasons", "warnings", "placement.pool_order")
                more = ("priorities.quota_full", "priorities.borrowable", "priorities.reasons", "budgets.status")
                for name in (*rules, *more):
                    steps[f"  of which data.autoscaler.{name} (alone)"] = lambda r=name: engine.eval_rule_as_json(
                        f"data.autoscaler.{r}"
                    )
            n = runs if size == "large" else runs * 20
            print(f"  {'step':56s} {'wall':>12s} {'CPU here':>12s}")
            for name, step in steps.items():
                step()
                wall, cpu = [], []
                for _ in range(n):
                    started, started_cpu = time.perf_counter(), time.thread_time()
                    step()
                    cpu.append((time.thread_time() - started_cpu) * 1000)
                    wall.append((time.perf_counter() - started) * 1000)
                # CPU time of this thread: steady on a loaded machine where wall time is
                # not, but blind to work done on another thread or in the child.
                print(f"  {name:56s} {statistics.median(wall):9.3f} ms {statistics.median(cpu):9.3f} ms")
    finally:
        runtime.close()
        child.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--teams", type=int, default=100)
    parser.add_argument("--pools", type=int, default=50)
    parser.add_argument("--queues", type=int, default=1000)
    parser.add_argument("--baseline", type=Path, help="another policy directory to measure in the same run")
    parser.add_argument("--previous", type=Path, help="another tree (git archive) to measure side by side")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--breakdown", action="store_true", help="time the steps of one evaluation")
    args = parser.parse_args()
    if args.breakdown:
        breakdown(args.teams, args.pools, args.queues, args.runs)
        return
    if args.worker:
        worker(args.teams, args.pools, args.queues)
        return
    if args.previous:
        side_by_side(args.previous, args.runs, args.teams, args.pools, args.queues)
        return
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
