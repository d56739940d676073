"""A finish may carry the attempt's last output (FinishIn.logs): kept as POST /logs
keeps it, in the finish's transaction. Promises tried: the output is there, in order,
after output sent before; a finish whose output is refused (too large) finishes
nothing, with the reason; a retried finish (the first won) keeps its output once; a
finish for a task the worker does not hold is the usual 404 and stores no output. Through the real app, on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from autoscaler.queueing.tasks import MAX_LOG_CHUNK
from tests.conftest import issue_token


def _leased(ctx: AppContext) -> tuple[TestClient, dict[str, str], str, str, dict[str, str]]:
    client = TestClient(create_app(ctx))
    admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}
    join = issue_token(ctx, "join", pool="gpu-pool")
    reg = client.post(
        "/api/v1/workers/register",
        json={
            "hostname": "h",
            "instance_id": "i-1",
            "provider": "fake",
            "pool": "gpu-pool",
            "gpus": [{"index": 0, "model": "A10G"}],
        },
        headers={"Authorization": f"Bearer {join}"},
    ).json()
    assert reg["finish_with_logs"] is True
    w = {"Authorization": f"Bearer {reg['worker_token']}"}
    tid = client.post("/api/v1/tasks", json={"queue": "gpu", "gpus": 1, "command": ["x"]}, headers=admin).json()["id"]
    base = f"/api/v1/workers/{reg['worker_id']}"
    assert client.post(f"{base}/lease", headers=w).json()["task"]["id"] == tid
    assert client.post(f"{base}/tasks/{tid}/start", headers=w).status_code == 200
    return client, w, base, tid, admin


def _logs(client: TestClient, tid: str, admin: dict[str, str]) -> list[tuple[str, str]]:
    r = client.get(f"/api/v1/tasks/{tid}/logs", headers=admin)
    assert r.status_code == 200, r.text
    return [(c["stream"], c["data"]) for c in r.json()]


def _finish(client: TestClient, w: dict[str, str], base: str, tid: str, **body: Any) -> Any:
    return client.post(f"{base}/tasks/{tid}/finish", json={"reason": "exit", "exit_code": 0, **body}, headers=w)


def test_the_last_output_is_kept_after_what_came_before(ctx: AppContext) -> None:
    client, w, base, tid, admin = _leased(ctx)
    client.post(f"{base}/tasks/{tid}/logs", json={"chunks": [{"stream": "stdout", "data": "first\n"}]}, headers=w)
    last = [{"stream": "stdout", "data": "last\n"}, {"stream": "stderr", "data": "warn\n"}]
    r = _finish(client, w, base, tid, logs=last)
    assert r.status_code == 200 and r.json()["state"] == "succeeded", r.text
    assert _logs(client, tid, admin) == [("stdout", "first\n"), ("stdout", "last\n"), ("stderr", "warn\n")]


def test_a_finish_whose_output_is_refused_finishes_nothing(ctx: AppContext) -> None:
    client, w, base, tid, admin = _leased(ctx)
    big = [{"stream": "stdout", "data": "x" * (MAX_LOG_CHUNK // 2 + 1)}] * 2
    r = _finish(client, w, base, tid, logs=big)
    assert r.status_code == 422, r.text
    assert "send smaller chunks" in r.json()["detail"]
    assert client.get(f"/api/v1/tasks/{tid}", headers=admin).json()["state"] == "running"
    assert _logs(client, tid, admin) == []
    # The agent's retry without the output (or smaller) still finishes it.
    assert _finish(client, w, base, tid).json()["state"] == "succeeded"


def test_a_retried_finish_or_one_for_a_task_not_held_stores_no_output(ctx: AppContext) -> None:
    client, w, base, tid, admin = _leased(ctx)
    assert _finish(client, w, base, tid).status_code == 200
    # A finish retried after its reply was lost: the first won, its output is not kept twice.
    again = _finish(client, w, base, tid, logs=[{"stream": "stdout", "data": "again"}])
    assert again.status_code == 200 and again.json()["state"] == "succeeded", again.text
    r = _finish(client, w, base, "no-such-task", logs=[{"stream": "stdout", "data": "stray"}])
    assert r.status_code == 404, r.text
    assert "not leased by worker" in r.json()["detail"]
    assert _logs(client, tid, admin) == []
