"""Task API behaviour: validation messages, limits, logs round trip."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from autoscaler.api.app import MAX_BODY_BYTES, create_app, json_depth_exceeds
from tests.conftest import issue_token


@pytest.fixture
def api(ctx):
    client = TestClient(create_app(ctx))
    team = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    return client, team, ctx


def test_validation_errors_name_the_field(api) -> None:
    client, team, _ = api
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["x"], "gpus": 999})
    assert r.status_code == 422 and "gpus" in r.json()["detail"]
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "nope", "command": ["x"]})
    assert r.status_code == 404 and "autoscaler queues" in r.json()["detail"]
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["x"], "working_dir": "/a/../b"})
    assert r.status_code == 422 and "working_dir" in r.json()["detail"]
    r = client.get("/api/v1/tasks?state=bogus", headers=team)
    assert r.status_code == 422


@pytest.mark.parametrize(
    "field,words",
    [
        # Each said "String should match pattern '^[a-z0-9][a-z0-9_.-]{0,62}$'" (or its like).
        ({"queue": "GPU"}, "body.queue: 'GPU' is not a name: lowercase letters, digits, '.', '_' and '-'"),
        ({"team": "vïsion"}, "body.team: 'vïsion' is not a name: lowercase letters"),
        ({"env": {"1A": "x"}}, "body.env.1A.[key]: '1A' is not a variable name: letters, digits and '_'"),
        ({"code": {"snapshot": "abc"}}, "body.code.snapshot: 'abc' is not a digest: 'sha256:' and 64"),
    ],
)
def test_a_pattern_mismatch_is_said_in_words(api, field: dict, words: str) -> None:
    client, team, _ = api
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["x"], **field})
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert "should match pattern" not in r.json()["detail"]


@pytest.mark.parametrize("field", ["timeout_s", "cpus", "expected_runtime_s"])
@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_refused_as_not_finite(api, field: str, literal: str) -> None:
    # Python's JSON reader takes these literals; each used to be refused as "less than
    # or equal to" the field's bound, which says nothing about what was wrong.
    client, team, _ = api
    body = f'{{"queue": "gpu", "command": ["x"], "{field}": {literal}}}'
    r = client.post("/api/v1/tasks", headers={**team, "content-type": "application/json"}, content=body)
    assert r.status_code == 422, r.text
    assert f"body.{field}: Input should be a finite number" in r.json()["detail"]


@pytest.mark.parametrize("program", ["", "  "])
def test_an_empty_program_is_refused_at_enqueue(api, program: str) -> None:
    # It was queued, leased and then failed on the worker (start_failed).
    client, team, _ = api
    r = client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": [program, "x"]})
    assert r.status_code == 422, r.text
    assert "body.command: Value error, the program (the first word of the command) is empty" in r.json()["detail"]


def test_oversized_and_deep_bodies_are_refused(api) -> None:
    client, team, _ = api
    big = {"queue": "gpu", "command": ["x" * 8000] * 300}
    r = client.post("/api/v1/tasks", headers=team, json=big)
    assert r.status_code == 413 and str(MAX_BODY_BYTES) in r.json()["detail"]
    deep = "[" * 5000 + "]" * 5000
    r = client.post("/api/v1/tasks", headers={**team, "content-type": "application/json"}, content=deep)
    assert r.status_code == 422 and "nested" in r.json()["detail"]
    r = client.post("/api/v1/tasks", headers={**team, "content-type": "application/json"}, content=b"{not json")
    assert r.status_code == 422


def test_json_depth_scanner_ignores_brackets_in_strings() -> None:
    assert not json_depth_exceeds(b'{"a": "[[[[[[[[[[[[[[[["}', 3)
    assert json_depth_exceeds(b'{"a": [[[1]]]}', 3)
    assert not json_depth_exceeds(b'{"a": "\\"[[[[["}', 2)


def test_logs_round_trip_through_worker_endpoints(api) -> None:
    client, team, ctx = api
    task = client.post(
        "/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["echo", "hi"], "gpus": 1}
    ).json()
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
    leased = client.post(f"/api/v1/workers/{wid}/lease", headers=worker).json()["task"]
    assert leased["id"] == task["id"] and leased["gpu_indices"] == [0]
    assert client.post(f"/api/v1/workers/{wid}/tasks/{task['id']}/start", headers=worker).json()["state"] == "running"
    r = client.post(
        f"/api/v1/workers/{wid}/tasks/{task['id']}/logs",
        headers=worker,
        json={"chunks": [{"stream": "stdout", "data": "hi\n"}, {"stream": "stderr", "data": "warn\n"}]},
    )
    assert r.json() == {"accepted": 2}
    r = client.post(
        f"/api/v1/workers/{wid}/tasks/{task['id']}/logs",
        headers=worker,
        json={"chunks": [{"stream": "stdout", "data": "x" * 200_000}] * 2},
    )
    assert r.status_code == 422 and "smaller chunks" in r.json()["detail"]
    done = client.post(
        f"/api/v1/workers/{wid}/tasks/{task['id']}/finish", headers=worker, json={"reason": "exit", "exit_code": 0}
    ).json()
    assert done["state"] == "succeeded"
    logs = client.get(f"/api/v1/tasks/{task['id']}/logs", headers=team).json()
    assert [c["data"] for c in logs] == ["hi\n", "warn\n"]
    after = client.get(f"/api/v1/tasks/{task['id']}/logs?after={logs[0]['id']}", headers=team).json()
    assert [c["data"] for c in after] == ["warn\n"]
    detail = client.get(f"/api/v1/tasks/{task['id']}", headers=team).json()
    assert [e["to_state"] for e in detail["events"]] == ["queued", "leased", "running", "succeeded"]


def test_queue_listing_shows_depth_and_wait(api) -> None:
    client, team, _ = api
    for _ in range(3):
        client.post("/api/v1/tasks", headers=team, json={"queue": "gpu", "command": ["true"], "gpus": 1})
    queues = {q["name"]: q for q in client.get("/api/v1/queues", headers=team).json()}
    assert queues["gpu"]["depth"] == 3 and queues["gpu"]["oldest_wait_s"] is not None
    assert queues["cpu"]["depth"] == 0
