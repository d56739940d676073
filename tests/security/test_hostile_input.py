"""Hostile request bodies get a clear 4xx with a message, never a 500, on both
databases: NUL bytes (PostgreSQL refuses them in text), oversized and deeply nested
bodies, huge log uploads, path tricks in working dirs, odd ids in paths."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.queueing.tasks import MAX_LOG_CHUNK
from tests.conftest import issue_token


@pytest.fixture
def api(ctx: Any) -> dict[str, Any]:
    app = create_app(ctx)
    app.state.limiter.max_failures = 10**9
    client = TestClient(app, raise_server_exceptions=False)
    team = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    join = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
    reg = client.post(
        "/api/v1/workers/register",
        headers={"Authorization": f"Bearer {join}"},
        json={"hostname": "h", "instance_id": "i-1", "provider": "fake", "pool": "gpu-pool", "gpus": [{"index": 0}]},
    ).json()
    return {
        "client": client,
        "team": team,
        "worker": {"Authorization": f"Bearer {reg['worker_token']}"},
        "wid": reg["worker_id"],
    }


def _clear_4xx(r: Any, *words: str) -> None:
    assert 400 <= r.status_code < 500, f"{r.status_code}: {r.text[:300]}"
    detail = r.json()["detail"]
    assert isinstance(detail, str) and detail
    assert "Traceback" not in detail
    for word in words:
        assert word in detail, detail


# Cases are looped inside one test per backend: the fixture (two databases, a
# registered worker) costs more than the requests.
def test_working_dir_path_tricks_refused(api: dict[str, Any]) -> None:
    for working_dir in ["../etc", "/a/../../etc/shadow", "relative/dir", "/x/..", ".."]:
        r = api["client"].post(
            "/api/v1/tasks", headers=api["team"], json={"queue": "gpu", "command": ["true"], "working_dir": working_dir}
        )
        _clear_4xx(r, "working_dir")


def test_clean_working_dir_is_normalised(api: dict[str, Any]) -> None:
    r = api["client"].post(
        "/api/v1/tasks",
        headers=api["team"],
        json={"queue": "gpu", "command": ["true"], "working_dir": "/data//runs/./a"},
    )
    assert r.status_code == 201 and r.json()["working_dir"] == "/data/runs/a"


def test_nul_bytes_in_text_fields_are_a_4xx(api: dict[str, Any]) -> None:
    # PostgreSQL cannot store U+0000 in text; SQLite can. Both must answer the same 4xx.
    cases = [
        ("command", ["echo", "a\x00b"]),
        ("env", {"K": "v\x00"}),
        ("gpu_type", "A10\x00G"),
        ("working_dir", "/ok/\x00/nul"),
    ]
    for field, value in cases:
        r = api["client"].post(
            "/api/v1/tasks", headers=api["team"], json={"queue": "gpu", "command": ["x"], field: value}
        )
        _clear_4xx(r, "NUL")


def test_nul_byte_in_log_chunk_is_a_4xx(api: dict[str, Any]) -> None:
    c = api["client"]
    c.post("/api/v1/tasks", headers=api["team"], json={"queue": "gpu", "command": ["x"], "gpus": 1})
    task = c.post(f"/api/v1/workers/{api['wid']}/lease", headers=api["worker"]).json()["task"]
    r = c.post(
        f"/api/v1/workers/{api['wid']}/tasks/{task['id']}/logs",
        headers=api["worker"],
        json={"chunks": [{"stream": "stdout", "data": "bad\x00byte"}]},
    )
    _clear_4xx(r)


def test_huge_log_upload_refused_and_nothing_stored(api: dict[str, Any]) -> None:
    c = api["client"]
    c.post("/api/v1/tasks", headers=api["team"], json={"queue": "gpu", "command": ["x"], "gpus": 1})
    task = c.post(f"/api/v1/workers/{api['wid']}/lease", headers=api["worker"]).json()["task"]
    url = f"/api/v1/workers/{api['wid']}/tasks/{task['id']}/logs"
    one_too_big = {"chunks": [{"stream": "stdout", "data": "x" * (MAX_LOG_CHUNK + 1)}]}
    _clear_4xx(c.post(url, headers=api["worker"], json=one_too_big))
    # Many chunks each under the per-chunk bound but over the per-upload bound.
    many = {"chunks": [{"stream": "stdout", "data": "y" * (MAX_LOG_CHUNK // 2)}] * 4}
    _clear_4xx(c.post(url, headers=api["worker"], json=many), str(MAX_LOG_CHUNK))
    # Over the body limit: refused before parsing.
    r = c.post(url, headers=api["worker"], json={"chunks": [{"stream": "stdout", "data": "z" * 200_000}] * 12})
    assert r.status_code == 413
    logs = c.get(f"/api/v1/tasks/{task['id']}/logs", headers=api["team"])
    assert logs.status_code == 200 and logs.json() == []


MALFORMED = [
    b"[" * 100_000,  # deep, and not even closed
    b'{"queue": "gpu", "command": ' + b"[" * 40 + b"]" * 40 + b"}",
    b"\xff\xfe not utf-8",
    b"",
    b"null",
    b'{"queue": "gpu", "command": ["x"], "gpus": 1e400}',
    b'{"queue": "gpu", "command": ["x"], "gpus": 99999999999999999999999999}',
]


def test_malformed_bodies(api: dict[str, Any]) -> None:
    for body in MALFORMED:
        r = api["client"].post(
            "/api/v1/tasks", headers={**api["team"], "content-type": "application/json"}, content=body
        )
        assert r.status_code == 422, (body[:40], r.text[:300])
        _clear_4xx(r)


def test_lying_content_length_refused(api: dict[str, Any]) -> None:
    r = api["client"].post(
        "/api/v1/tasks",
        headers={**api["team"], "content-length": "99999999999", "content-type": "application/json"},
        content=b"{}",
    )
    assert r.status_code == 413


ODD_PATHS = [
    "/api/v1/tasks/" + "a" * 5000,
    "/api/v1/tasks/%00",
    "/api/v1/tasks/..%2F..%2Fetc%2Fpasswd",
    "/api/v1/tasks/'%20OR%201=1--",
    "/api/v1/queues/%F0%9F%92%A5",
    "/api/v1/decisions/99999999999999999999999",
    "/api/v1/instances?limit=-1",
    "/api/v1/tasks?limit=10000000000000000000",
    "/api/v1/tasks/x/logs?after=99999999999999999999999",
    "/api/v1/tasks?queue=a%00b",
]


def test_odd_paths_and_queries_are_4xx(api: dict[str, Any], ctx: Any) -> None:
    admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}
    for path in ODD_PATHS:
        r = api["client"].get(path, headers=admin)
        assert r.status_code != 500, path
        _clear_4xx(r)


def test_nul_scanner_is_exact() -> None:
    from autoscaler.api.hostile import body_has_nul

    assert body_has_nul(b'{"a": ["x\\u0000"]}')
    assert body_has_nul(b'{"k\\u0000": 1}')
    # An escaped backslash followed by the text "u0000" is not a NUL.
    assert not body_has_nul(b'{"a": "\\\\u0000"}')
    assert not body_has_nul(b'{"a": "plain"}')
