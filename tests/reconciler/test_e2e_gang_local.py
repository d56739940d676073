"""A multi-node task end to end on one machine: `autoscaler up` (a real process: API,
reconciler, embedded policy, local provider, real agent processes). A 2-node x 2-GPU
gang launches two local machines with ONE launch request (nodes=2, one shared join
token that registers each of them once); both ranks start within a second of each other with
the rendezvous variables, meet over TCP (no torch) and the gang succeeds. Then a second
gang's rank 1 agent is killed: the whole gang is stopped and requeued as one (its
machine-caused end spends no attempt) and succeeds on the next attempt."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from providers.base import TAG_GANG
from tests.local_up import kill_rank_agent, local_up, until_requeued
from tests.local_up import until as _until

# Each rank prints when it started and its variables, then meets the others at
# MASTER_ADDR:MASTER_PORT (rank 0 listens, the others connect and send their rank).
# It exits 0 once the file named by GANG_GO exists, and fails after a minute.
RANK = r"""
import os, socket, sys, time
print("START", repr(time.time()), flush=True)
e = os.environ
keys = ["NNODES", "NODE_RANK", "GPUS_PER_NODE", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "AUTOSCALER_GANG_ID"]
print("ENV", " ".join(f"{k}={e[k]}" for k in keys), flush=True)
n, rank, addr, port = int(e["NNODES"]), int(e["NODE_RANK"]), e["MASTER_ADDR"], int(e["MASTER_PORT"])
if rank == 0:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((addr, port))
    srv.listen(n)
    srv.settimeout(30)
    seen = []
    for _ in range(n - 1):
        c, _a = srv.accept()
        seen.append(int(c.recv(16).decode()))
        c.sendall(b"ok")
        c.close()
    print("MET", sorted(seen), flush=True)
else:
    deadline = time.time() + 30
    while True:
        try:
            c = socket.create_connection((addr, port), timeout=2)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    c.sendall(str(rank).encode())
    print("MET", c.recv(16).decode(), flush=True)
end = time.time() + 60
while not os.path.exists(e["GANG_GO"]):
    if time.time() > end:
        sys.exit(1)
    time.sleep(0.2)
"""


def _lines(api: httpx.Client, task_id: str, rank: int) -> list[tuple[int, str]]:
    chunks = api.get(f"/api/v1/tasks/{task_id}/logs", params={"rank": rank}).json()
    return [(c["attempt"], line) for c in chunks for line in c["data"].splitlines()]


def _starts(api: httpx.Client, task_id: str, attempt: int) -> list[float]:
    return [
        float(line.split()[1])
        for rank in (0, 1)
        for a, line in _lines(api, task_id, rank)
        if a == attempt and line.startswith("START")
    ]


def test_a_two_node_gang_runs_together_and_recovers_as_one(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    script.chmod(0o644)
    tmp_path.chmod(0o755)  # tasks may run as another user: they read the script
    with local_up(tmp_path, reconcile={"interval_s": 2, "heartbeat_timeout_s": 20}, stop_timeout_s=15) as up:
        api, home, log = up.api, up.home, up.log

        def submit(go: Path) -> str:
            reply = api.post(
                "/api/v1/tasks",
                json={
                    "queue": "gpu",
                    "gpus": 2,
                    "nodes": 2,
                    "team": "vision",
                    "command": [sys.executable, str(script)],
                    "env": {"GANG_GO": str(go)},
                },
            )
            assert reply.status_code == 201, reply.text
            return str(reply.json()["id"])

        def state_of(task_id: str) -> str:
            return str(api.get(f"/api/v1/tasks/{task_id}").json()["state"])

        # 1. A gang that may finish at once.
        go1 = tmp_path / "go1"
        go1.write_text("")
        first = submit(go1)
        done = ("succeeded", "failed", "canceled")
        assert _until("the first gang to end", lambda: state_of(first) in done and state_of(first), 90, log) == (
            "succeeded"
        )
        instances = api.get("/api/v1/instances", params={"include_terminated": True}).json()
        assert len([i for i in instances if i["pool"] == "local-gpu"]) == 2
        # Through the one-request path: the local driver's records of the gang's two
        # machines name ONE launch request (nodes=2), tagged with the gang.
        records = [json.loads(p.read_text()) for p in sorted((home / "local-instances").glob("*/instance.json"))]
        gang_records = [r for r in records if r["tags"].get(TAG_GANG) == first]
        assert len(gang_records) == 2, records
        assert len({r["request_id"] for r in gang_records}) == 1, gang_records
        starts = _starts(api, first, 1)
        assert len(starts) == 2 and abs(starts[0] - starts[1]) < 1.0, starts
        print(f"first gang: rank start skew {abs(starts[0] - starts[1]) * 1000:.0f} ms")
        envs = {
            rank: dict(kv.split("=", 1) for kv in line.split()[1:])
            for rank in (0, 1)
            for _a, line in _lines(api, first, rank)
            if line.startswith("ENV")
        }
        for rank in (0, 1):
            e = envs[rank]
            assert (e["NNODES"], e["NODE_RANK"], e["GPUS_PER_NODE"], e["WORLD_SIZE"]) == ("2", str(rank), "2", "4")
            assert e["MASTER_ADDR"] == "127.0.0.1" and e["AUTOSCALER_GANG_ID"] == first
        assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
        assert any(line == "MET [1]" for _a, line in _lines(api, first, 0))
        assert any(line == "MET ok" for _a, line in _lines(api, first, 1))
        detail = api.get(f"/api/v1/tasks/{first}").json()
        assert sorted((r["rank"], r["state"], r["exit_code"]) for r in detail["ranks"]) == [
            (0, "exited", 0),
            (1, "exited", 0),
        ]

        # 2. A gang whose rank 1 loses its agent mid-run.
        go2 = tmp_path / "go2"
        second = submit(go2)

        def met() -> bool:
            return any(line.startswith("MET") for _a, line in _lines(api, second, 1))

        _until("the second gang to meet", met, 90, log)
        victim = kill_rank_agent(api, home, second, 1)
        after = until_requeued(api, second, 60, log)
        assert after["failures"] == 0 and after["end_reason"].startswith("lost:")
        stopped = [r for r in after["ranks"] if r["attempt"] == 1 and r["rank"] == 0]
        assert stopped and stopped[0]["state"] in ("stopping", "exited", "released")
        go2.write_text("")
        assert _until("the second gang to end", lambda: state_of(second) in done and state_of(second), 120, log) == (
            "succeeded"
        )
        final = api.get(f"/api/v1/tasks/{second}").json()
        assert final["attempts"] == 2 and final["failures"] == 0
        last = [r for r in final["ranks"] if r["attempt"] == 2]
        assert sorted((r["rank"], r["exit_code"]) for r in last) == [(0, 0), (1, 0)]
        assert victim not in {r["worker_id"] for r in last}
        starts = _starts(api, second, 2)
        assert len(starts) == 2 and abs(starts[0] - starts[1]) < 1.0, starts
        print(f"second gang, attempt 2: rank start skew {abs(starts[0] - starts[1]) * 1000:.0f} ms")
