"""Every role against every endpoint. Another team's task answers 404, not 403."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from tests.conftest import issue_token

ROLES = ["none", "bad", "admin", "vision", "nlp", "join", "worker", "other_worker"]
_names = itertools.count()


@pytest.fixture
def world(ctx):
    client = TestClient(create_app(ctx))
    tokens = {
        "bad": "asa_not-a-real-token",
        "admin": issue_token(ctx, "admin"),
        "vision": issue_token(ctx, "team", team="vision"),
        "nlp": issue_token(ctx, "team", team="nlp"),
        "join": issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1)),
    }
    workers = {}
    for name in ("worker", "other_worker"):
        join = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
        r = client.post(
            "/api/v1/workers/register",
            headers={"Authorization": f"Bearer {join}"},
            json={"hostname": name, "instance_id": f"i-{name}", "provider": "fake", "pool": "gpu-pool"},
        )
        assert r.status_code == 201, r.text
        tokens[name], workers[name] = r.json()["worker_token"], r.json()["worker_id"]
    r = client.post(
        "/api/v1/tasks",
        headers={"Authorization": f"Bearer {tokens['vision']}"},
        json={"queue": "gpu", "command": ["true"]},
    )
    assert r.status_code == 201
    return client, tokens, workers, r.json()["id"]


def _call(client, tokens, role, method, path, body):
    headers = {} if role == "none" else {"Authorization": f"Bearer {tokens[role]}"}
    return client.request(method, path, headers=headers, json=body)


def _register_body(_w):
    return {"hostname": "h", "instance_id": "i-join", "provider": "fake", "pool": "gpu-pool"}


# (method, path template, body factory, {role: status}); unlisted roles: none/bad -> 401, rest -> 403.
USER_READ = {"admin": 200, "vision": 200, "nlp": 200}
MATRIX = [
    ("GET", "/healthz", None, {r: 200 for r in ROLES}),
    (
        "GET",
        "/api/v1/whoami",
        None,
        {"admin": 200, "vision": 200, "nlp": 200, "join": 200, "worker": 200, "other_worker": 200},
    ),
    ("GET", "/api/v1/queues", None, USER_READ),
    ("GET", "/api/v1/queues/gpu", None, USER_READ),
    ("POST", "/api/v1/queues", lambda w: {"name": f"q{next(_names)}", "pools": ["gpu-pool"]}, {"admin": 201}),
    (
        "POST",
        "/api/v1/tasks",
        lambda w: {"queue": "gpu", "command": ["true"]},
        {"admin": 201, "vision": 201, "nlp": 201},
    ),
    ("GET", "/api/v1/tasks", None, USER_READ),
    ("GET", "/api/v1/tasks/{task}", None, {"admin": 200, "vision": 200, "nlp": 404}),
    ("GET", "/api/v1/tasks/{task}/logs", None, {"admin": 200, "vision": 200, "nlp": 404}),
    ("GET", "/api/v1/tasks/{task}/why", None, {"admin": 200, "vision": 200, "nlp": 404}),
    ("POST", "/api/v1/tasks/{task}/cancel", lambda w: {}, {"admin": 200, "vision": 200, "nlp": 404}),
    ("POST", "/api/v1/workers/register", _register_body, {"join": 201}),
    ("POST", "/api/v1/workers/{worker}/heartbeat", lambda w: {}, {"worker": 200, "other_worker": 404}),
    ("POST", "/api/v1/workers/{worker}/lease", lambda w: {}, {"worker": 200, "other_worker": 404}),
    ("POST", "/api/v1/workers/{worker}/tasks/{task}/start", lambda w: {}, {"worker": 404, "other_worker": 404}),
    (
        "POST",
        "/api/v1/workers/{worker}/tasks/{task}/finish",
        lambda w: {"reason": "exit", "exit_code": 0},
        {"worker": 404, "other_worker": 404},
    ),
    (
        "POST",
        "/api/v1/workers/{worker}/tasks/{task}/logs",
        lambda w: {"chunks": []},
        {"worker": 404, "other_worker": 404},
    ),
    ("GET", "/api/v1/workers", None, {"admin": 200}),
    ("GET", "/api/v1/workers/{worker}", None, {"admin": 200}),
    ("POST", "/api/v1/workers/{worker}/drain", lambda w: {"deadline_s": 60}, {"admin": 200}),
    ("GET", "/api/v1/pools", None, USER_READ),
    ("GET", "/api/v1/instances", None, USER_READ),
    ("GET", "/api/v1/decisions", None, USER_READ),
    ("POST", "/api/v1/tokens", lambda w: {"kind": "team", "team": "vision"}, {"admin": 201}),
]


def expected(role: str, table: dict[str, int]) -> int:
    if role in table:
        return table[role]
    return 401 if role in ("none", "bad") else 403


@pytest.mark.parametrize("method,path,body,table", MATRIX, ids=[f"{m} {p}" for m, p, _, _ in MATRIX])
def test_role_matrix(world, method, path, body, table) -> None:
    client, tokens, workers, task = world
    url = path.format(task=task, worker=workers["worker"])
    for role in ROLES:
        r = _call(client, tokens, role, method, url, body(workers) if body else None)
        assert r.status_code == expected(role, table), f"{role} {method} {url}: {r.status_code} {r.text}"
        assert "detail" in r.json() or r.status_code < 400


def test_team_member_lists_only_its_team(world) -> None:
    client, tokens, _w, task = world
    _call(client, tokens, "nlp", "POST", "/api/v1/tasks", {"queue": "gpu", "command": ["true"]})
    seen_by_nlp = _call(client, tokens, "nlp", "GET", "/api/v1/tasks", None).json()
    assert seen_by_nlp and all(t["team"] == "nlp" for t in seen_by_nlp)
    assert task not in {t["id"] for t in seen_by_nlp}
    assert _call(client, tokens, "nlp", "GET", "/api/v1/tasks?team=vision", None).json() == []


def test_team_cannot_enqueue_to_a_queue_it_is_not_allowed(world) -> None:
    client, tokens, _w, _t = world
    r = _call(client, tokens, "nlp", "POST", "/api/v1/tasks", {"queue": "vision-only", "command": ["true"]})
    assert r.status_code == 403 and "vision-only" in r.json()["detail"]


def test_reused_join_token_refused_for_another_instance(world) -> None:
    client, tokens, _w, _t = world
    first = _call(client, tokens, "join", "POST", "/api/v1/workers/register", _register_body(None))
    assert first.status_code == 201
    again = _call(
        client,
        tokens,
        "join",
        "POST",
        "/api/v1/workers/register",
        {**_register_body(None), "instance_id": "i-someone-else"},
    )
    assert again.status_code == 403 and "already used" in again.json()["detail"]


def test_expired_join_token_refused(ctx) -> None:
    client = TestClient(create_app(ctx))
    token = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(seconds=-1))
    r = client.post("/api/v1/workers/register", headers={"Authorization": f"Bearer {token}"}, json=_register_body(None))
    assert r.status_code == 401


def test_deregistered_worker_token_is_revoked(world) -> None:
    client, tokens, workers, _t = world
    w = workers["worker"]
    assert _call(client, tokens, "worker", "POST", f"/api/v1/workers/{w}/deregister", {}).status_code == 200
    assert _call(client, tokens, "worker", "POST", f"/api/v1/workers/{w}/heartbeat", {}).status_code == 401


def test_auth_failures_are_rate_limited(ctx) -> None:
    client = TestClient(create_app(ctx))
    codes = [client.get("/api/v1/tasks", headers={"Authorization": "Bearer nope"}).status_code for _ in range(25)]
    assert codes[0] == 401 and codes[-1] == 429
