"""A task's GPU use (issue 23 item 10): samples recorded per worker from heartbeats,
attributed to a task by its attempts' worker, GPU indices and time windows, and shown
by the API, `autoscaler task show` and the task page, to the task's team only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from autoscaler.state.db import transaction
from autoscaler.state.models import GpuSample
from tests.conftest import LiveServer, issue_token, make_context

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def world(config: AutoscalerConfig, sessions: sessionmaker[Session]) -> Iterator[dict[str, Any]]:
    clock = ManualClock(T0)
    ctx = make_context(config, sessions, clock)  # retention defaults: a sample per 30 s at most
    server = LiveServer(ctx).start()
    admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}
    http = httpx.Client(base_url=server.url, timeout=10)
    join = http.post("/api/v1/tokens", json={"kind": "join", "pool": "gpu-pool"}, headers=admin).json()["token"]
    reg = http.post(
        "/api/v1/workers/register",
        json={
            "hostname": "h",
            "instance_id": "i-2gpu",
            "provider": "fake",
            "pool": "gpu-pool",
            "gpus": [{"index": 0, "model": "A10G"}, {"index": 1, "model": "A10G"}],
        },
        headers={"Authorization": f"Bearer {join}"},
    ).json()
    worker = {"Authorization": f"Bearer {reg['worker_token']}"}
    yield {
        "ctx": ctx,
        "clock": clock,
        "url": server.url,
        "http": http,
        "admin": admin,
        "worker": worker,
        "id": reg["worker_id"],
    }
    http.close()
    server.stop()


def _beat(w: dict[str, Any], util: tuple[float, float], mem: tuple[float, float]) -> None:
    metrics = [
        {"index": i, "utilization_pct": util[i], "memory_used_mb": mem[i], "memory_total_mb": 24000} for i in (0, 1)
    ]
    r = w["http"].post(f"/api/v1/workers/{w['id']}/heartbeat", json={"gpu_metrics": metrics}, headers=w["worker"])
    assert r.status_code == 200, r.text


def _enqueue_and_lease(w: dict[str, Any], team: str) -> str:
    r = w["http"].post(
        "/api/v1/tasks", json={"queue": "gpu", "gpus": 1, "command": ["train"], "team": team}, headers=w["admin"]
    )
    assert r.status_code == 201, r.text
    leased = w["http"].post(f"/api/v1/workers/{w['id']}/lease", headers=w["worker"]).json()["task"]
    assert leased["id"] == r.json()["id"]
    return str(leased["id"])


def test_each_task_sees_only_its_gpus_and_its_time(world: dict[str, Any]) -> None:
    w, clock = world, world["clock"]
    _beat(w, (55, 55), (1, 1))  # before any task: nobody's
    clock.advance(60)
    a = _enqueue_and_lease(w, "vision")  # GPU 0
    b = _enqueue_and_lease(w, "nlp")  # GPU 1
    for _ in range(9):  # every 10 s for 90 s; a sample kept every 30 s
        clock.advance(10)
        _beat(w, (90, 10), (12000, 2000))
    w["http"].post(
        f"/api/v1/workers/{w['id']}/tasks/{a}/finish", json={"reason": "exit", "exit_code": 0}, headers=w["worker"]
    )
    clock.advance(60)
    _beat(w, (0, 20), (0, 3000))  # after a ended: b's only

    with transaction(w["ctx"].sessions) as s:
        kept = s.scalar(select(func.count()).select_from(GpuSample))
    assert kept == 2 * (1 + 3 + 1), kept  # 2 GPUs x (before, 3 of 9 beats, after)

    use_a = w["http"].get(f"/api/v1/tasks/{a}/gpu", headers=w["admin"]).json()
    assert use_a["samples"] == 3 and use_a["mean_utilization_pct"] == 90.0
    assert use_a["peak_memory_used_mb"] == 12000 and use_a["memory_total_mb"] == 24000
    assert {k for p in use_a["points"] for k in p["per_gpu"]} == {"0"}  # never GPU 1
    use_b = w["http"].get(f"/api/v1/tasks/{b}/gpu", headers=w["admin"]).json()
    assert use_b["samples"] == 4 and use_b["mean_utilization_pct"] == 12.5  # (10*3 + 20) / 4
    assert use_b["peak_memory_used_mb"] == 3000


def test_gpu_use_is_visible_to_the_tasks_team_only(world: dict[str, Any]) -> None:
    w = world
    a = _enqueue_and_lease(w, "vision")
    w["clock"].advance(31)
    _beat(w, (70, 0), (5000, 0))
    vision = {"Authorization": f"Bearer {issue_token(w['ctx'], 'team', team='vision')}"}
    nlp = {"Authorization": f"Bearer {issue_token(w['ctx'], 'team', team='nlp')}"}
    assert w["http"].get(f"/api/v1/tasks/{a}/gpu", headers=vision).json()["mean_utilization_pct"] == 70.0
    other = w["http"].get(f"/api/v1/tasks/{a}/gpu", headers=nlp)
    assert other.status_code == 404 and "not found" in other.json()["detail"]  # same answer as a missing task
    assert w["http"].get(f"/api/v1/tasks/{a}/gpu").status_code == 401


def test_a_cpu_task_and_a_task_without_samples_say_so(world: dict[str, Any]) -> None:
    w = world
    a = _enqueue_and_lease(w, "vision")
    use = w["http"].get(f"/api/v1/tasks/{a}/gpu", headers=w["admin"]).json()
    assert use["samples"] == 0 and use["points"] == [] and use["mean_utilization_pct"] is None


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        cwd=Path(__file__).resolve().parents[2],
    )


def test_task_show_and_task_page_show_gpu_use(world: dict[str, Any]) -> None:
    w = world
    a = _enqueue_and_lease(w, "vision")
    for util in (20, 60, 100):
        w["clock"].advance(30)
        _beat(w, (util, 0), (8000, 0))
    token = issue_token(w["ctx"], "team", team="vision")
    env = {"AUTOSCALER_SERVER": w["url"], "AUTOSCALER_TOKEN": token, "COLUMNS": "200"}
    shown = _cli("task", "show", a, env=env)
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.startswith("gpu use:"))
    assert "mean 60.0 % over 3 sample(s)" in line and "peak memory 8,000 of 24,000 MB" in line, line
    assert line.endswith("▂▅█"), line
    as_json = json.loads(_cli("task", "show", a, "--json", env=env).stdout)
    assert as_json["gpu_use"]["samples"] == 3 and as_json["gpu_use"]["mean_utilization_pct"] == 60.0

    page = httpx.Client(base_url=w["url"], timeout=10)
    assert page.post("/login", data={"token": token, "next": "/tasks"}).status_code == 303
    html = page.get(f"/tasks/{a}").text
    assert 'id="task-gpu" data-samples="3"' in html and "60.0 %" in html and "8,000 of 24,000 MB" in html
    assert "GPU use of this task" in html and "<polyline" in html
