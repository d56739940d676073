"""Multi-node tasks through the HTTP API: `nodes` validated and refused with the reason
when no pool can hold the gang, ranks in the task detail, one rank's logs, and the
rendezvous variables in what each rank's worker leases (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.auth.tokens import create_token
from autoscaler.state.db import transaction
from tests.conftest import LiveServer, issue_token


@pytest.fixture
def api(ctx):
    client = TestClient(create_app(ctx))
    team = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    return client, team, ctx


def _register(client: httpx.Client, ctx, n: int, address: str | None) -> tuple[str, dict[str, str]]:
    with transaction(ctx.sessions) as s:
        join, _ = create_token(s, kind="join", now=ctx.clock.now(), pool="gpu-pool", ttl=timedelta(hours=1))
    body = {
        "hostname": f"h{n}",
        "instance_id": f"i-{n}",
        "provider": "fake",
        "pool": "gpu-pool",
        "gpus": [{"index": 0, "model": "NVIDIA A10G", "uuid": f"GPU-{n}", "memory_mb": 24000}],
    }
    if address:
        body["address"] = address
    r = client.post("/api/v1/workers/register", headers={"Authorization": f"Bearer {join}"}, json=body)
    assert r.status_code in (200, 201), r.text
    reply = r.json()
    return reply["worker_id"], {"Authorization": f"Bearer {reply['worker_token']}"}


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"nodes": 0}, ["nodes", "greater than or equal to 1"]),
        ({"nodes": 257}, ["nodes", "less than or equal to 256"]),
        ({"nodes": 5, "gpus": 1}, ["needs 5 machines at once", "gpu-pool (4)", "max_instances"]),
        ({"nodes": 2, "gpus": 2}, ["2 GPUs", "largest"]),
    ],
)
def test_a_gang_no_pool_can_hold_is_refused_with_the_reason(api, extra, words) -> None:
    client, team, _ = api
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["x"], **extra})
    assert r.status_code in (400, 422), r.text
    detail = r.json()["detail"]
    for word in words:
        assert word in detail, detail


def test_ranks_lease_with_rendezvous_variables_and_show_in_the_task(api) -> None:
    client, team, ctx = api
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["train"], "gpus": 1, "nodes": 2})
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    assert r.json()["nodes"] == 2
    w0, h0 = _register(client, ctx, 0, "10.0.0.7")
    w1, h1 = _register(client, ctx, 1, None)
    first = client.post(f"/api/v1/workers/{w0}/lease", headers=h0).json()
    assert first == {"task": None, "reserved": True, "heartbeat": None}  # rank 0 held; the gang is not complete
    got1 = client.post(f"/api/v1/workers/{w1}/lease", headers=h1).json()["task"]
    got0 = client.post(f"/api/v1/workers/{w0}/lease", headers=h0).json()["task"]
    for rank, got, worker in ((0, got0, w0), (1, got1, w1)):
        assert got["id"] == task_id and got["worker_id"] == worker and got["gpu_indices"] == [0]
        env = got["env"]
        assert (env["NNODES"], env["NODE_RANK"], env["WORLD_SIZE"], env["GPUS_PER_NODE"]) == ("2", str(rank), "2", "1")
        assert env["MASTER_ADDR"] == "10.0.0.7" and env["AUTOSCALER_GANG_ID"] == task_id
    assert got0["env"]["MASTER_PORT"] == got1["env"]["MASTER_PORT"]
    for worker, h in ((w0, h0), (w1, h1)):
        assert client.post(f"/api/v1/workers/{worker}/tasks/{task_id}/start", headers=h).status_code == 200
        chunk = {"chunks": [{"stream": "stdout", "data": f"from {worker}\n"}]}
        assert client.post(f"/api/v1/workers/{worker}/tasks/{task_id}/logs", headers=h, json=chunk).status_code == 200
    detail = client.get(f"/api/v1/tasks/{task_id}", headers=team).json()
    assert detail["state"] == "running"
    assert sorted((r["rank"], r["worker_id"], r["state"]) for r in detail["ranks"]) == [
        (0, w0, "running"),
        (1, w1, "running"),
    ]
    one = client.get(f"/api/v1/tasks/{task_id}/logs", headers=team, params={"rank": 1}).json()
    assert [(c["rank"], c["data"]) for c in one] == [(1, f"from {w1}\n")]
    assert len(client.get(f"/api/v1/tasks/{task_id}/logs", headers=team).json()) == 2
    r = client.get(f"/api/v1/tasks/{task_id}/logs", headers=team, params={"rank": 2})
    assert r.status_code == 422 and "there is no rank 2" in r.json()["detail"]
    # Rank 1 fails: the gang's attempt ends, rank 0 is told to stop.
    body = {"reason": "exit", "exit_code": 2}
    assert (
        client.post(f"/api/v1/workers/{w1}/tasks/{task_id}/finish", headers=h1, json=body).json()["state"] == "queued"
    )
    beat = client.post(f"/api/v1/workers/{w0}/heartbeat", headers=h0, json={"running": [task_id]}).json()
    assert beat["cancel"] == [task_id]


def test_the_cli_and_the_task_page_show_ranks_and_one_ranks_logs(ctx) -> None:
    server = LiveServer(ctx).start()
    try:
        http = httpx.Client(base_url=server.url, timeout=10)
        token = issue_token(ctx, "team", team="vision")
        env = {"AUTOSCALER_SERVER": server.url, "AUTOSCALER_TOKEN": token, "COLUMNS": "220"}
        enq = _cli("enqueue", "--queue", "gpu", "--gpus", "1", "--nodes", "2", "--", "train", env=env)
        assert enq.returncode == 0, enq.stderr
        task_id = enq.stdout.strip()
        refused = _cli("enqueue", "--queue", "gpu", "--gpus", "1", "--nodes", "9", "--", "train", env=env)
        assert refused.returncode != 0 and "needs 9 machines at once" in refused.stderr + refused.stdout
        workers = [_register(http, ctx, n, None) for n in (0, 1)]
        for w, h in [*workers, workers[0]]:
            http.post(f"/api/v1/workers/{w}/lease", headers=h)
        for w, h in workers:
            http.post(f"/api/v1/workers/{w}/tasks/{task_id}/start", headers=h)
            chunk = {"chunks": [{"stream": "stdout", "data": f"hello from {w}\n"}]}
            http.post(f"/api/v1/workers/{w}/tasks/{task_id}/logs", headers=h, json=chunk)
        shown = _cli("task", "show", task_id, env=env)
        assert shown.returncode == 0, shown.stderr
        assert "gpus: 1 x 2 nodes" in shown.stdout and "ranks" in shown.stdout
        assert all(w in shown.stdout for w, _h in workers)
        one = _cli("logs", task_id, "--rank", "1", env=env)
        assert one.returncode == 0 and one.stdout == f"hello from {workers[1][0]}\n", one.stdout
        page = httpx.Client(base_url=server.url, timeout=10)
        assert page.post("/login", data={"token": token, "next": "/tasks"}).status_code == 303
        html = page.get(f"/tasks/{task_id}").text
        assert 'id="task-ranks"' in html and 'id="task-nodes">2<' in html
        assert html.count('<tr data-rank="') == 2
    finally:
        server.stop()


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )
