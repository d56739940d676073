"""Load on the API from simulated agents, against a real `autoscaler server` on PostgreSQL.

    .venv/bin/python bench/api_load.py --agents 250,500,1000,2000 --step-s 20 [--task-rate 200]

Starts a throwaway PostgreSQL server and the real server process on 127.0.0.1 (or
uses --pg-url), registers agents with their own join tokens, then ramps the agent
count. Every simulated agent does what `autoscaler agent` does on the wire:
a heartbeat every 10 s (with the ids it runs); while idle, a long-poll lease that
waits in the server until work fits or its next heartbeat is due (--lease-wait-s,
the agent's --lease-wait) and, where the server records it, carries the idle
agent's heartbeat instead of a request of its own; against a server that answers at once (no long-poll), or
with --lease-wait-s 0, a lease poll every 2 s backing off after empty polls as the
agent does (2 s, 4 s, then every 5 s: --lease-max-s); no poll while its GPU is
busy, and for each task: start, one log chunk, finish (the chunk in the finish where
the server takes it there). Long-polls wait on purpose,
so their latency is kept out of the overall p50/p99; `long_poll_late_p99_ms` is how
late an empty one came back after its hold ran out. --workers N starts
the server with N API processes. A producer enqueues
--task-rate tasks/s with a team token (on schedule, up to 64 in flight); a task "runs"
--task-s seconds. Each agent has its own HTTP client and connections, as a real agent
process does (one shared pool made long-polls starve the other calls in the client,
and cost the client O(pool) per request).

For each step it prints the sustained request rate, completions/s, p50/p99 latency
per endpoint and overall, errors, and the client's own event-loop lag (when the
client is saturated, latency includes time waiting in the client, so the lag is
reported next to it). The largest step whose overall p99 is under --p99-ms is
reported. Everything is bounded: steps x step-s plus setup; only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LONG_POLL = "lease (long-poll)"  # kept out of the overall latency: it waits on purpose
TASK = {"queue": "load", "command": ["train.py", "--epochs", "1"], "gpus": 1}  # what the producer enqueues
CONFIG = """
deployment: bench
database_url: {db}
teams: [{{name: load}}]
queues: [{{name: load, pools: [gpu]}}]
pools:
  - name: gpu
    provider: fake
    max_instances: 100000
    instance_types: [{{name: g.1, gpus: 1, gpu_type: A10G, cpus: 4, memory_mb: 16000, on_demand_price: 1.0}}]
reconcile: {{heartbeat_timeout_s: 120}}
"""


@dataclass
class Stats:
    latencies: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    error_samples: list[str] = field(default_factory=list)
    completions: int = 0
    enqueued: int = 0
    loop_lag: list[float] = field(default_factory=list)
    held_late: list[float] = field(default_factory=list)  # empty long-polls: answer time past the hold


class Recorder:
    """Collects into the current step's Stats; None while warming up."""

    def __init__(self) -> None:
        self.current: Stats | None = None
        self.enqueued_total = 0
        self.completed_total = 0

    async def call(
        self, client: httpx.AsyncClient, kind: str, method: str, url: str, hold: float = 0.0, **kw: Any
    ) -> Any:
        """One request. A long-poll (`hold` > 0) is meant to take long: its latency is
        kept apart (not in the overall p50/p99); an empty answer records how late it
        came after the hold ran out, i.e. the server's own delay."""
        t0 = time.perf_counter()
        try:
            r = await client.request(method, url, **kw)
            ok = r.status_code < 400
            detail = f"{r.status_code} {r.text[:120]}"
        except httpx.HTTPError as exc:
            r, ok, detail = None, False, f"{type(exc).__name__}: {exc}"
        elapsed = time.perf_counter() - t0
        stats = self.current
        if stats is not None:
            stats.latencies[kind].append(elapsed)
            if hold and r is not None and ok and r.json().get("task") is None:
                stats.held_late.append(max(0.0, elapsed - hold))
            if not ok:
                stats.errors[kind] += 1
                if len(stats.error_samples) < 5:
                    stats.error_samples.append(f"{kind}: {detail}")
        return r if ok else None


class Agent:
    def __init__(
        self,
        n: int,
        worker_id: str,
        token: str,
        args: argparse.Namespace,
        rec: Recorder,
        folds: tuple[bool, bool] = (False, False),
    ) -> None:
        self.n, self.worker_id, self.args, self.rec = n, worker_id, args, rec
        self.headers = {"Authorization": f"Bearer {token}"}
        self.base = f"/api/v1/workers/{worker_id}"
        self.running: str | None = None
        self.next_heartbeat = time.monotonic()
        # As the agent does where the server records it (RegisterOut.heartbeat_in_lease):
        # an idle agent's heartbeat rides its long-poll instead of a request of its own.
        self.folds = folds[0] and args.lease_wait_s > 0
        # And its task's last output goes with the finish (RegisterOut.finish_with_logs).
        self.finish_logs = folds[1]

    def _beat(self) -> dict[str, Any]:
        return {
            "running": [self.running] if self.running else [],
            "gpu_metrics": [{"index": 0, "utilization_pct": 90 if self.running else 0}],
        }

    async def heartbeats(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        self.next_heartbeat = time.monotonic() + random.uniform(0, self.args.heartbeat_s)
        while not stop.is_set():
            await asyncio.sleep(max(self.next_heartbeat - time.monotonic(), 0.0))
            if time.monotonic() < self.next_heartbeat:
                continue  # a lease carried this one
            if self.folds and self.running is None:
                await asyncio.sleep(0.05)  # idle: the next lease carries it
                continue
            self.next_heartbeat = time.monotonic() + self.args.heartbeat_s
            await self.rec.call(
                client, "heartbeat", "POST", f"{self.base}/heartbeat", json=self._beat(), headers=self.headers
            )

    async def work(self, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        await asyncio.sleep(random.uniform(0, self.args.lease_s))
        wait = self.args.lease_s
        while not stop.is_set():
            # As the agent does: an idle lease waits in the server (long-poll) until work
            # fits, never past the next heartbeat; a server that answers at once (no
            # long-poll) gets the old polling with back-off.
            body: dict[str, Any] = {}
            if self.folds and time.monotonic() >= self.next_heartbeat:
                body = {"heartbeat": self._beat()}
                self.next_heartbeat = time.monotonic() + self.args.heartbeat_s
            hold = min(self.args.lease_wait_s, self.next_heartbeat - time.monotonic())
            hold = hold if hold >= 0.5 else 0.0
            url = f"{self.base}/lease" + (f"?wait_s={hold:.3f}" if hold else "")
            asked = time.monotonic()
            kind = LONG_POLL if hold else "lease"
            r = await self.rec.call(
                client,
                kind,
                "POST",
                url,
                hold=hold,
                json=body,
                headers=self.headers,
                timeout=self.args.timeout_s + hold,
            )
            task = r.json().get("task") if r is not None else None
            if task is None:
                if hold and r is not None and time.monotonic() - asked >= hold / 2:
                    wait = self.args.lease_s
                    await asyncio.sleep(0.05)  # the agent's loop tick before it asks again
                    continue
                await asyncio.sleep(wait)
                wait = min(wait * 2, max(self.args.lease_max_s, self.args.lease_s))
                continue
            wait = self.args.lease_s
            tid = task["id"]
            self.running = tid
            await self.rec.call(client, "start", "POST", f"{self.base}/tasks/{tid}/start", headers=self.headers)
            await asyncio.sleep(self.args.task_s * random.uniform(0.5, 1.5))
            chunk = {"chunks": [{"stream": "stdout", "data": f"step done by agent {self.n}\n" * 32}]}
            end: dict[str, Any] = {"reason": "exit", "exit_code": 0}
            if self.finish_logs:
                end["logs"] = chunk["chunks"]  # as the agent does: one request
            else:
                await self.rec.call(
                    client, "logs", "POST", f"{self.base}/tasks/{tid}/logs", json=chunk, headers=self.headers
                )
            done = await self.rec.call(
                client, "finish", "POST", f"{self.base}/tasks/{tid}/finish", json=end, headers=self.headers
            )
            self.running = None
            if done is not None:
                self.rec.completed_total += 1
                if self.rec.current is not None:
                    self.rec.current.completions += 1


async def producer(
    client: httpx.AsyncClient,
    headers: dict[str, str],
    rate: float,
    rec: Recorder,
    stop: asyncio.Event,
    max_backlog: int,
    agents: list[Agent],
) -> None:
    """Enqueue at `rate`/s, but keep at most `max_backlog` tasks waiting so a slow
    server is measured, not buried under an ever-growing queue. Enqueues are sent on
    schedule, not one after another's answer (many users enqueue at once), with at most
    64 in flight: the rate holds while one enqueue takes longer than 1/rate."""
    interval = 1.0 / rate
    next_at = time.perf_counter()
    in_flight: set[asyncio.Task[None]] = set()
    gate = asyncio.Semaphore(64)

    async def one() -> None:
        async with gate:
            r = await rec.call(
                client,
                "enqueue",
                "POST",
                "/api/v1/tasks",
                headers=headers,
                json=TASK,
            )
        if r is not None:
            rec.enqueued_total += 1
            if rec.current is not None:
                rec.current.enqueued += 1

    try:
        while not stop.is_set():
            busy = sum(1 for a in agents if a.running)
            waiting = rec.enqueued_total + len(in_flight) - rec.completed_total - busy
            if waiting < max_backlog:
                t = asyncio.create_task(one())
                in_flight.add(t)
                t.add_done_callback(in_flight.discard)
            next_at += interval
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
    finally:
        for t in list(in_flight):
            t.cancel()


async def lag_probe(rec: Recorder, stop: asyncio.Event) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.05)
        if rec.current is not None:
            rec.current.loop_lag.append(time.perf_counter() - t0 - 0.05)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def team_headers(client: httpx.AsyncClient, admin: dict[str, str]) -> dict[str, str]:
    """A team token's headers for the bench's team (enqueues)."""
    team = await client.post("/api/v1/tokens", headers=admin, json={"kind": "team", "team": "load"})
    team.raise_for_status()
    return {"Authorization": f"Bearer {team.json()['token']}"}


async def register(
    client: httpx.AsyncClient,
    admin: dict[str, str],
    count: int,
    start: int,
    folds: list[tuple[bool, bool]] | None = None,
) -> list[tuple[str, str]]:
    """Registered agents' (worker id, token); `folds` gets whether the server records a
    heartbeat carried by a lease and takes a finish's output in the finish (servers
    before those do not say)."""
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> tuple[str, str]:
        async with sem:
            j = await client.post("/api/v1/tokens", headers=admin, json={"kind": "join", "pool": "gpu"})
            j.raise_for_status()
            r = await client.post(
                "/api/v1/workers/register",
                headers={"Authorization": f"Bearer {j.json()['token']}"},
                json={
                    "hostname": f"sim-{i}",
                    "instance_id": f"i-sim-{i}",
                    "provider": "fake",
                    "pool": "gpu",
                    "gpus": [{"index": 0, "model": "A10G", "simulated": True}],
                },
            )
            r.raise_for_status()
            if folds is not None:
                reply = r.json()
                folds.append((bool(reply.get("heartbeat_in_lease")), bool(reply.get("finish_with_logs"))))
            return r.json()["worker_id"], r.json()["worker_token"]

    return list(await asyncio.gather(*(one(i) for i in range(start, start + count))))


async def run(args: argparse.Namespace, base_url: str, admin_token: str) -> list[dict[str, Any]]:
    steps = [int(x) for x in args.agents.split(",")]
    limits = httpx.Limits(max_connections=args.connections, max_keepalive_connections=args.connections)
    # Every agent its own client, as every real agent is its own process: its long-poll
    # holds its own connection, and one shared pool of thousands of connections costs
    # the client O(pool) per request (httpcore scans it), which would measure the client.
    own = httpx.Limits(max_connections=2, max_keepalive_connections=2)
    timeout = httpx.Timeout(args.timeout_s)
    rec = Recorder()
    admin = {"Authorization": f"Bearer {admin_token}"}
    results: list[dict[str, Any]] = []
    async with (
        httpx.AsyncClient(base_url=base_url, limits=limits, timeout=timeout) as client,
        contextlib.AsyncExitStack() as agent_clients,
    ):
        team = await team_headers(client, admin)
        stop = asyncio.Event()
        agents: list[Agent] = []
        loops: list[asyncio.Task[None]] = [asyncio.create_task(lag_probe(rec, stop))]
        loops.append(asyncio.create_task(producer(client, team, args.task_rate, rec, stop, args.max_backlog, agents)))
        for target in steps:
            t_reg = time.perf_counter()
            folds: list[tuple[bool, bool]] = []
            new = await register(client, admin, target - len(agents), len(agents), folds)
            reg_s = time.perf_counter() - t_reg
            for (wid, tok), fold in zip(new, folds, strict=True):
                agent = Agent(len(agents), wid, tok, args, rec, fold)
                agents.append(agent)
                mine = await agent_clients.enter_async_context(
                    httpx.AsyncClient(base_url=base_url, limits=own, timeout=timeout)
                )
                loops.append(asyncio.create_task(agent.heartbeats(mine, stop)))
                loops.append(asyncio.create_task(agent.work(mine, stop)))
            rec.current = None
            await asyncio.sleep(args.warmup_s)  # new agents spread their first calls over this
            stats = Stats()
            rec.current = stats
            t0 = time.perf_counter()
            await asyncio.sleep(args.step_s)
            elapsed = time.perf_counter() - t0
            rec.current = None
            everything = [x for k, v in stats.latencies.items() if k != LONG_POLL for x in v]
            held = stats.latencies.get(LONG_POLL, [])
            row = {
                "agents": target,
                "seconds": round(elapsed, 1),
                "requests": len(everything) + len(held),
                "rps": round((len(everything) + len(held)) / elapsed, 1),
                "long_polls": len(held),
                "long_poll_late_p99_ms": round(pct(stats.held_late, 0.99), 1),
                "completions_per_s": round(stats.completions / elapsed, 1),
                "enqueued_per_s": round(stats.enqueued / elapsed, 1),
                "p50_ms": round(pct(everything, 0.50), 1),
                "p99_ms": round(pct(everything, 0.99), 1),
                "errors": sum(stats.errors.values()),
                "client_loop_lag_p99_ms": round(pct(stats.loop_lag, 0.99), 1),
                "registration_s": round(reg_s, 1),
                "per_endpoint": {
                    k: {
                        "n": len(v),
                        "p50_ms": round(pct(v, 0.5), 1),
                        "p99_ms": round(pct(v, 0.99), 1),
                        "errors": stats.errors.get(k, 0),
                    }
                    for k, v in sorted(stats.latencies.items())
                },
                "error_samples": stats.error_samples,
            }
            results.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "per_endpoint"}), flush=True)
            if row["p99_ms"] > args.stop_above_ms:
                print(f"p99 above {args.stop_above_ms} ms: stopping the ramp", flush=True)
                break
        stop.set()
        for t in loops:
            t.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
    return results


def start_server(db_url: str, home: Path, port: int, workers: int = 1) -> subprocess.Popen[bytes]:
    cfg = home / "autoscaler.yaml"
    cfg.write_text(CONFIG.format(db=db_url))
    log = open(home / "server.log", "wb")  # noqa: SIM115 - closed with the process
    env = {**os.environ, "AUTOSCALER_HOME": str(home)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoscaler",
            "server",
            "--config",
            str(cfg),
            "--home",
            str(home),
            "--port",
            str(port),
            *(["--workers", str(workers)] if workers > 1 else []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], home: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {(home / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit("server did not become healthy")


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| agents | req/s | completions/s | p50 ms | p99 ms | errors | client loop lag p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['agents']} | {r['rps']} | {r['completions_per_s']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['errors']} | {r['client_loop_lag_p99_ms']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--agents", default="250,500,1000,2000", help="ramp steps (cumulative agent counts)")
    p.add_argument("--step-s", type=float, default=20.0, help="measured seconds per step")
    p.add_argument("--warmup-s", type=float, default=10.0, help="unmeasured seconds after adding agents")
    p.add_argument("--task-rate", type=float, default=200.0, help="tasks enqueued per second")
    p.add_argument("--task-s", type=float, default=5.0, help="mean simulated task duration")
    p.add_argument("--max-backlog", type=int, default=400, help="most tasks waiting at once")
    p.add_argument("--heartbeat-s", type=float, default=10.0)
    p.add_argument("--lease-s", type=float, default=2.0, help="lease poll interval while idle (the agent's)")
    p.add_argument(
        "--lease-max-s",
        type=float,
        default=5.0,
        help="idle back-off cap after empty leases (the agent's: 2.5 x lease-s)",
    )
    p.add_argument(
        "--lease-wait-s",
        type=float,
        default=20.0,
        help="idle lease long-poll (the agent's --lease-wait; capped at the next heartbeat); 0: poll",
    )
    p.add_argument("--workers", type=int, default=1, help="API processes (`autoscaler server --workers`)")
    p.add_argument(
        "--connections",
        type=int,
        default=64,
        help="connections of the producer's and admin's client (each agent has its own two, as a real agent"
        " process does)",
    )
    p.add_argument("--timeout-s", type=float, default=10.0)
    p.add_argument("--p99-ms", type=float, default=100.0, help="the latency target")
    p.add_argument("--stop-above-ms", type=float, default=2000.0, help="end the ramp once p99 passes this")
    p.add_argument("--pg-url", help="use this PostgreSQL server (a database 'bench_load' is created)")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args(argv)

    from sqlalchemy import create_engine, text

    from tests.pgserver import PostgresServer, free_port

    pg = None
    server_url = args.pg_url
    if server_url is None:
        pg = PostgresServer()
        server_url = pg.start()
    admin_engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin_engine.connect() as c:
        c.execute(text("DROP DATABASE IF EXISTS bench_load WITH (FORCE)"))
        c.execute(text("CREATE DATABASE bench_load"))
    db_url = server_url.rsplit("/", 1)[0] + "/bench_load"
    home = Path(tempfile.mkdtemp(prefix="autoscaler-bench-"))
    port = free_port()
    proc = start_server(db_url, home, port, args.workers)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc, home)
        admin_token = (home / "admin.token").read_text().strip()
        results = asyncio.run(run(args, url, admin_token))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        with admin_engine.connect() as c:
            c.execute(text("DROP DATABASE IF EXISTS bench_load WITH (FORCE)"))
        admin_engine.dispose()
        if pg is not None:
            pg.stop()
    held = [r["agents"] for r in results if r["p99_ms"] <= args.p99_ms and r["errors"] == 0]
    print()
    print(table(results))
    print(f"\nlargest agent count with p99 <= {args.p99_ms:g} ms and no errors: {max(held) if held else 'none'}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
