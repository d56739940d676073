"""Sequential cost of one API request: one client, one keep-alive connection.

    .venv/bin/python bench/api_sequential.py --workers 1,2 [--requests 200]

Starts a throwaway PostgreSQL server and, for each --workers value, the real
`autoscaler server` process on 127.0.0.1 (as bench/api_load.py does), registers one
agent, then times `/healthz`, a heartbeat, an empty lease and a lease carrying a
heartbeat (an idle agent's one request per interval) one after the other; then one
task's life one task at a time: enqueue, the lease that takes it, start, finish.
Prints, per call, the median latency after 10 warm-up requests and the server
processes' CPU milliseconds per request (from /proc, so Linux only). Load cannot
hide in a queue here: a fixed delay per request (Nagle + delayed ACK, a sleep)
shows as latency far above the CPU figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.api_load import TASK, register, start_server, team_headers, wait_healthy  # noqa: E402


def server_pids(pid: int) -> list[int]:
    """`pid` and its children (uvicorn's worker processes), found once per server."""
    children = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [pid, *map(int, children)]


def cpu_ms(pids: list[int]) -> float:
    """User + system CPU of these processes."""
    ticks = 0
    for p in pids:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks * 10.0  # USER_HZ is 100 on Linux


async def measure(url: str, admin: str, pid: int, n: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    pids = server_pids(pid)  # the server is up: its worker processes are there
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        ((wid, tok),) = await register(client, {"Authorization": f"Bearer {admin}"}, 1, 0)
        headers = {"Authorization": f"Bearer {tok}"}
        calls = {
            "healthz": ("GET", "/healthz", None),
            "heartbeat": ("POST", f"/api/v1/workers/{wid}/heartbeat", {"running": [], "gpu_metrics": []}),
            "empty lease": ("POST", f"/api/v1/workers/{wid}/lease", None),
            # An idle agent's interval where the server records a heartbeat carried by a
            # lease: this one request instead of a heartbeat and a lease (a server before
            # that ignores the body: there it is an empty lease).
            "lease carrying a heartbeat": (
                "POST",
                f"/api/v1/workers/{wid}/lease",
                {"heartbeat": {"running": [], "gpu_metrics": []}},
            ),
        }
        for name, (method, path, body) in calls.items():
            times = []
            c0 = cpu_ms(pids)
            for _ in range(n + 10):
                t0 = time.perf_counter()
                r = await client.request(method, path, json=body, headers=headers)
                r.raise_for_status()
                times.append((time.perf_counter() - t0) * 1000)
            out[name] = {
                "median_ms": round(statistics.median(times[10:]), 2),
                "server_cpu_ms": round((cpu_ms(pids) - c0) / (n + 10), 2),
            }
        out.update(await task_life(client, admin, wid, headers, pids, n))
    return out


async def task_life(
    client: httpx.AsyncClient, admin: str, wid: str, headers: dict[str, str], pids: list[int], n: int
) -> dict[str, dict[str, float]]:
    """One task's calls, each timed apart: the enqueue, the lease that takes it, start,
    and finish (without output, which servers before issue 20 do not take there),
    one task at a time."""
    team = await team_headers(client, {"Authorization": f"Bearer {admin}"})
    base = f"/api/v1/workers/{wid}"
    times: dict[str, list[float]] = {k: [] for k in ("enqueue", "lease that takes a task", "start", "finish")}
    cpu: dict[str, float] = dict.fromkeys(times, 0.0)

    async def timed(name: str, method: str, path: str, body: object, hdrs: dict[str, str]) -> httpx.Response:
        c0 = cpu_ms(pids)
        t0 = time.perf_counter()
        r = await client.request(method, path, json=body, headers=hdrs)
        r.raise_for_status()
        times[name].append((time.perf_counter() - t0) * 1000)
        cpu[name] += cpu_ms(pids) - c0
        return r

    for _ in range(n + 10):
        await timed("enqueue", "POST", "/api/v1/tasks", TASK, team)
        leased = await timed("lease that takes a task", "POST", f"{base}/lease", None, headers)
        tid = leased.json()["task"]["id"]
        await timed("start", "POST", f"{base}/tasks/{tid}/start", None, headers)
        end = {"reason": "exit", "exit_code": 0}
        await timed("finish", "POST", f"{base}/tasks/{tid}/finish", end, headers)
    return {
        name: {
            "median_ms": round(statistics.median(ts[10:]), 2),
            # /proc ticks are 10 ms: summed over all requests, then divided
            "server_cpu_ms": round(cpu[name] / len(ts), 2),
        }
        for name, ts in times.items()
    }


def main(argv: list[str] | None = None) -> dict[int, dict[str, dict[str, float]]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", default="1,2", help="API process counts to measure, in turn")
    p.add_argument("--requests", type=int, default=200, help="timed requests per call")
    args = p.parse_args(argv)

    from sqlalchemy import create_engine, text

    from tests.pgserver import PostgresServer, free_port

    pg = PostgresServer()
    server_url = pg.start()
    admin_engine = create_engine(server_url, isolation_level="AUTOCOMMIT")
    results: dict[int, dict[str, dict[str, float]]] = {}
    try:
        for workers in (int(w) for w in args.workers.split(",")):
            with admin_engine.connect() as c:
                c.execute(text("DROP DATABASE IF EXISTS bench_seq WITH (FORCE)"))
                c.execute(text("CREATE DATABASE bench_seq"))
            home = Path(tempfile.mkdtemp(prefix="autoscaler-bench-"))
            port = free_port()
            proc = start_server(server_url.rsplit("/", 1)[0] + "/bench_seq", home, port, workers)
            url = f"http://127.0.0.1:{port}"
            try:
                wait_healthy(url, proc, home)
                admin = (home / "admin.token").read_text().strip()
                results[workers] = asyncio.run(measure(url, admin, proc.pid, args.requests))
                print(json.dumps({"workers": workers, **results[workers]}), flush=True)
            finally:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
    finally:
        admin_engine.dispose()
        pg.stop()
    return results


if __name__ == "__main__":
    main()
