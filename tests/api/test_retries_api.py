"""Retry settings through the HTTP API: validation, and both counters in what a task
reads back (on SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from tests.conftest import issue_token


@pytest.fixture
def api(ctx):
    client = TestClient(create_app(ctx))
    team = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    return client, team, ctx


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"max_attempts": 0}, ["max_attempts", "greater than or equal to 1"]),
        ({"max_attempts": -3}, ["max_attempts", "greater than or equal to 1"]),
        ({"max_attempts": 101}, ["max_attempts", "less than or equal to 100"]),
        ({"retry_on_exit_codes": [0]}, ["retry_on_exit_codes", "0 is not an exit code 1-255", "128+N"]),
        ({"retry_on_exit_codes": [1, 256]}, ["retry_on_exit_codes", "256 is not an exit code 1-255"]),
        ({"retry_on_exit_codes": [-9]}, ["retry_on_exit_codes", "-9 is not an exit code", "137 for SIGKILL"]),
        ({"retry_on_exit_codes": list(range(1, 70))}, ["retry_on_exit_codes", "at most 64"]),
        ({"retry_on_exit_codes": ["x"]}, ["retry_on_exit_codes", "integer"]),
        ({"retry_on_exit_codes": 1}, ["retry_on_exit_codes", "list"]),
    ],
)
def test_bad_retry_settings_are_422_with_a_clear_message(api, extra: dict[str, Any], words: list[str]) -> None:
    client, team, _ = api
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["x"], **extra})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    for word in words:
        assert word in detail, detail


def test_a_task_reads_back_failures_interruptions_and_its_retry_codes(api) -> None:
    client, team, ctx = api
    r = client.post(
        "/api/v1/tasks",
        headers=team,
        json={"queue": "gpu", "command": ["train"], "gpus": 1, "max_attempts": 3, "retry_on_exit_codes": [137, 3]},
    )
    assert r.status_code == 201, r.text
    task = r.json()
    assert (task["max_attempts"], task["retry_on_exit_codes"], task["failures"], task["interruptions"]) == (
        3,
        [3, 137],
        0,
        0,
    )
    plain = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["x"]}).json()
    assert plain["retry_on_exit_codes"] is None and plain["max_attempts"] == 3

    join = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
    reg = client.post(
        "/api/v1/workers/register",
        headers={"Authorization": f"Bearer {join}"},
        json={
            "hostname": "h",
            "instance_id": "i-1",
            "provider": "fake",
            "pool": "gpu-pool",
            "gpus": [{"index": 0, "model": "A10G"}],
        },
    ).json()
    worker = {"Authorization": f"Bearer {reg['worker_token']}"}
    wid = reg["worker_id"]

    def attempt(**finish: Any) -> dict[str, Any]:
        leased = client.post(f"/api/v1/workers/{wid}/lease", headers=worker).json()["task"]
        assert leased is not None and leased["id"] == task["id"]
        client.post(f"/api/v1/workers/{wid}/tasks/{task['id']}/start", headers=worker)
        r = client.post(f"/api/v1/workers/{wid}/tasks/{task['id']}/finish", headers=worker, json=finish)
        assert r.status_code == 200, r.text
        return dict(r.json())

    spot = attempt(reason="interrupted", detail="spot")
    assert (spot["state"], spot["failures"], spot["interruptions"]) == ("queued", 0, 1)
    oom = attempt(reason="exit", exit_code=-9, detail="killed by SIGKILL")
    assert (oom["state"], oom["failures"], oom["interruptions"], oom["exit_code"]) == ("queued", 1, 1, -9)
    # The plain task waited since before the failure: it goes first.
    other = client.post(f"/api/v1/workers/{wid}/lease", headers=worker).json()["task"]
    assert other["id"] == plain["id"]
    client.post(
        f"/api/v1/workers/{wid}/tasks/{plain['id']}/finish", headers=worker, json={"reason": "exit", "exit_code": 0}
    )
    last = attempt(reason="exit", exit_code=4)
    assert (last["state"], last["failures"], last["interruptions"], last["attempts"]) == ("failed", 2, 1, 3)
    detail = client.get(f"/api/v1/tasks/{task['id']}", headers=team).json()
    ends = [(e["from_state"], e["to_state"], e["reason"]) for e in detail["events"] if e["from_state"] == "running"]
    assert ends == [
        ("running", "interrupted", "interrupted:spot"),
        ("running", "queued", "exit -9"),
        ("running", "failed", "exit 4"),
    ]
    assert "exit code 4 is not one of retry_on_exit_codes [3, 137]" in detail["events"][-1]["detail"]
    listed = client.get("/api/v1/tasks", headers=team).json()
    mine = next(t for t in listed if t["id"] == task["id"])
    assert (mine["failures"], mine["interruptions"]) == (2, 1)
