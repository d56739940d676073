"""Security promises, end to end through the real app and databases.

- tokens are stored only as SHA-256 digests (the plaintext is nowhere in the database)
  and compared with hmac.compare_digest;
- join tokens are bound to one instance and expire; worker tokens act only for their worker;
- team isolation: tasks, logs, metrics series;
- no token plaintext in the server's log output, even at DEBUG and on failures;
- the server refuses a non-loopback address without TLS in front; auth failures are rate limited.
"""

from __future__ import annotations

import hmac
import logging
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, select, text

from autoscaler.api.app import create_app
from autoscaler.api.ratelimit import AuthFailureLimiter, TooManyFailures
from autoscaler.auth import tokens as token_mod
from autoscaler.config import AutoscalerConfig, ServerConfig
from autoscaler.errors import ConfigError
from autoscaler.server import check_listen_address
from autoscaler.state.models import ApiToken
from tests.conftest import REPO, issue_token


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _register(client: TestClient, join: str, instance: str) -> dict[str, Any]:
    r = client.post(
        "/api/v1/workers/register",
        headers=_bearer(join),
        json={
            "hostname": instance,
            "instance_id": instance,
            "provider": "fake",
            "pool": "gpu-pool",
            "gpus": [{"index": 0, "model": "A10G"}],
        },
    )
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def world(ctx: Any, caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    caplog.set_level(logging.DEBUG)  # everything any logger says during the test is checked for secrets
    client = TestClient(create_app(ctx))
    admin = issue_token(ctx, "admin")
    team_tokens = {
        "vision": client.post("/api/v1/tokens", headers=_bearer(admin), json={"kind": "team", "team": "vision"}),
        "nlp": client.post("/api/v1/tokens", headers=_bearer(admin), json={"kind": "team", "team": "nlp"}),
    }
    assert all(r.status_code == 201 for r in team_tokens.values())
    join = client.post("/api/v1/tokens", headers=_bearer(admin), json={"kind": "join", "pool": "gpu-pool"}).json()
    worker_a = _register(client, join["token"], "i-a")
    worker_b = _register(client, issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1)), "i-b")
    return {
        "client": client,
        "admin": admin,
        "join": join["token"],
        "vision": team_tokens["vision"].json()["token"],
        "nlp": team_tokens["nlp"].json()["token"],
        "a": worker_a,
        "b": worker_b,
    }


def _all_plaintexts(w: dict[str, Any]) -> list[str]:
    return [w["admin"], w["join"], w["vision"], w["nlp"], w["a"]["worker_token"], w["b"]["worker_token"]]


def _dump_database(ctx: Any) -> str:
    """Every value of every row of every table, as text."""
    parts: list[str] = []
    with ctx.sessions() as s:
        names = inspect(s.get_bind()).get_table_names()
        for table in names:
            for row in s.execute(text(f'SELECT * FROM "{table}"')):
                parts.append(" ".join(str(v) for v in row))
    return "\n".join(parts)


def test_tokens_are_stored_as_digests_only(world: dict[str, Any], ctx: Any) -> None:
    dump = _dump_database(ctx)
    for plaintext in _all_plaintexts(world):
        assert plaintext not in dump
        assert plaintext.split("_", 1)[1] not in dump  # not even without the kind prefix
        assert token_mod.hash_token(plaintext) in dump
    with ctx.sessions() as s:
        rows = s.scalars(select(ApiToken)).all()
    assert rows and all(len(r.token_hash) == 64 and len(r.prefix) <= 8 for r in rows)


def test_tokens_are_compared_in_constant_time(world: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(token_mod.hmac, "compare_digest", spy)
    r = world["client"].get("/api/v1/whoami", headers=_bearer(world["vision"]))
    assert r.status_code == 200 and r.json()["team"] == "vision"
    assert seen == [(token_mod.hash_token(world["vision"]),) * 2]


def test_join_token_is_bound_to_its_first_instance_and_expires(world: dict[str, Any], ctx: Any) -> None:
    c = world["client"]
    # The same instance retrying its registration is allowed (the old worker is superseded) ...
    again = _register(c, world["join"], "i-a")
    assert again["worker_id"] != world["a"]["worker_id"]
    # The superseded worker's token can only hear that it must shut down; it leases nothing.
    old = f"/api/v1/workers/{world['a']['worker_id']}"
    old_auth = _bearer(world["a"]["worker_token"])
    beat = c.post(f"{old}/heartbeat", headers=old_auth, json={})
    assert beat.status_code == 200 and beat.json()["shutdown"] is True
    c.post("/api/v1/tasks", headers=_bearer(world["vision"]), json={"queue": "gpu", "command": ["x"], "gpus": 1})
    lease = c.post(f"{old}/lease", headers=old_auth)
    assert lease.status_code >= 400 or lease.json()["task"] is None, lease.text
    # ... another instance is not.
    r = c.post(
        "/api/v1/workers/register",
        headers=_bearer(world["join"]),
        json={"hostname": "x", "instance_id": "i-other", "provider": "fake", "pool": "gpu-pool"},
    )
    assert r.status_code == 403
    # A join token for one pool cannot register into another.
    other_pool = issue_token(ctx, "join", pool="cpu-pool", ttl=timedelta(hours=1))
    r = c.post(
        "/api/v1/workers/register",
        headers=_bearer(other_pool),
        json={"hostname": "x", "instance_id": "i-c", "provider": "fake", "pool": "gpu-pool"},
    )
    assert r.status_code == 403 and "cpu-pool" in r.json()["detail"]
    # Join tokens made through the API expire by default.
    with ctx.sessions() as s:
        joins = s.scalars(select(ApiToken).where(ApiToken.kind == "join")).all()
    assert joins and all(j.expires_at is not None for j in joins)
    # A join token does nothing but register.
    assert c.get("/api/v1/tasks", headers=_bearer(world["join"])).status_code == 403


def test_worker_cannot_touch_another_workers_task(world: dict[str, Any]) -> None:
    c = world["client"]
    c.post("/api/v1/tasks", headers=_bearer(world["vision"]), json={"queue": "gpu", "command": ["x"], "gpus": 1})
    b, a = world["b"], world["a"]
    task = c.post(f"/api/v1/workers/{b['worker_id']}/lease", headers=_bearer(b["worker_token"])).json()["task"]
    assert task is not None
    a_auth = _bearer(a["worker_token"])
    base_own = f"/api/v1/workers/{a['worker_id']}/tasks/{task['id']}"
    base_other = f"/api/v1/workers/{b['worker_id']}/tasks/{task['id']}"
    for base in (base_own, base_other):  # through its own id, and impersonating B
        assert c.post(f"{base}/start", headers=a_auth).status_code == 404
        assert c.post(f"{base}/finish", headers=a_auth, json={"reason": "exit", "exit_code": 0}).status_code == 404
        assert (
            c.post(
                f"{base}/logs", headers=a_auth, json={"chunks": [{"stream": "stdout", "data": "forged"}]}
            ).status_code
            == 404
        )
    assert c.post(f"/api/v1/workers/{b['worker_id']}/deregister", headers=a_auth).status_code == 404
    # B's task is untouched: still leased by B, no forged logs.
    got = c.get(f"/api/v1/tasks/{task['id']}", headers=_bearer(world["admin"])).json()
    assert got["state"] == "leased" and got["worker_id"] == b["worker_id"]
    assert c.get(f"/api/v1/tasks/{task['id']}/logs", headers=_bearer(world["admin"])).json() == []
    # A worker token is no user: it cannot enqueue, list or read tasks.
    assert c.get("/api/v1/tasks", headers=a_auth).status_code == 403
    assert c.get(f"/api/v1/tasks/{task['id']}/logs", headers=a_auth).status_code == 403


def test_team_isolation_for_logs_and_metrics(world: dict[str, Any]) -> None:
    c = world["client"]
    task = c.post(
        "/api/v1/tasks", headers=_bearer(world["vision"]), json={"queue": "gpu", "command": ["x"], "gpus": 1}
    ).json()
    a = world["a"]
    leased = c.post(f"/api/v1/workers/{a['worker_id']}/lease", headers=_bearer(a["worker_token"])).json()["task"]
    assert leased["id"] == task["id"]
    r = c.post(
        f"/api/v1/workers/{a['worker_id']}/tasks/{task['id']}/logs",
        headers=_bearer(a["worker_token"]),
        json={"chunks": [{"stream": "stdout", "data": "vision-secret-output"}]},
    )
    assert r.status_code == 200
    assert (
        c.get(f"/api/v1/tasks/{task['id']}/logs", headers=_bearer(world["vision"])).json()[0]["data"]
        == "vision-secret-output"
    )
    assert c.get(f"/api/v1/tasks/{task['id']}/logs", headers=_bearer(world["nlp"])).status_code == 404
    c.post("/api/v1/tasks", headers=_bearer(world["nlp"]), json={"queue": "cpu", "command": ["y"]})
    nlp_metrics = c.get("/metrics", headers=_bearer(world["nlp"]))
    assert nlp_metrics.status_code == 200
    assert 'team="nlp"' in nlp_metrics.text and 'team="vision"' not in nlp_metrics.text
    assert "vision-secret-output" not in nlp_metrics.text
    admin_metrics = c.get("/metrics", headers=_bearer(world["admin"])).text
    assert 'team="nlp"' in admin_metrics and 'team="vision"' in admin_metrics
    assert c.get("/metrics").status_code == 401


def test_no_token_in_log_output(world: dict[str, Any], caplog: pytest.LogCaptureFixture) -> None:
    c = world["client"]
    # Failures are what tends to log request details: bad tokens, wrong kinds, 404s.
    c.get("/api/v1/tasks", headers=_bearer(world["join"]))
    c.get("/api/v1/tasks", headers=_bearer(world["a"]["worker_token"] + "x"))
    c.post("/api/v1/workers/register", headers=_bearer(world["join"]), json={"bad": 1})
    c.post(f"/api/v1/workers/{world['b']['worker_id']}/heartbeat", headers=_bearer(world["a"]["worker_token"]), json={})
    c.post("/api/v1/tokens", headers=_bearer(world["admin"]), json={"kind": "join", "pool": "nope"})
    text_logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    for plaintext in _all_plaintexts(world):
        assert plaintext not in text_logged


def test_server_refuses_non_loopback_without_tls() -> None:
    for host in ("0.0.0.0", "10.1.2.3", "::", "example.org"):
        cfg = AutoscalerConfig(server=ServerConfig(host=host))
        with pytest.raises(ConfigError, match="tls_terminated_upstream"):
            check_listen_address(cfg)
        check_listen_address(AutoscalerConfig(server=ServerConfig(host=host, tls_terminated_upstream=True)))
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        check_listen_address(AutoscalerConfig(server=ServerConfig(host=host)))


def test_cli_server_refuses_public_address_with_one_line(tmp_path: Any) -> None:
    # The real command: exits 1 with a message and no traceback, and never binds.
    proc = subprocess.run(
        [sys.executable, "-m", "autoscaler", "server", "--host", "0.0.0.0", "--port", "0", "--home", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "tls" in proc.stderr.lower() and "Traceback" not in proc.stderr


def test_rate_limit_is_per_client_and_lifts_after_the_window() -> None:
    limiter = AuthFailureLimiter(max_failures=3, window_s=0.3)
    for _ in range(3):
        limiter.check("1.2.3.4")
        limiter.failed("1.2.3.4")
    with pytest.raises(TooManyFailures):
        limiter.check("1.2.3.4")
    limiter.check("5.6.7.8")  # another client is unaffected
    time.sleep(0.35)
    limiter.check("1.2.3.4")


def test_rate_limited_client_is_refused_even_with_a_valid_token(world: dict[str, Any]) -> None:
    # Once locked out, a guesser learns nothing, not even when a guess is right.
    c = world["client"]
    for _ in range(20):
        c.get("/api/v1/whoami", headers=_bearer("asa_guess"))
    r = c.get("/api/v1/whoami", headers=_bearer(world["admin"]))
    assert r.status_code == 429 and "too many" in r.json()["detail"]
