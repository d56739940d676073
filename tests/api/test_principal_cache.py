"""The principal cache: revocation and expiry still take effect, within the documented bound."""

from __future__ import annotations

import time
from datetime import timedelta

from fastapi.testclient import TestClient
from sqlalchemy import update

from autoscaler.api.app import create_app
from autoscaler.auth.tokens import PrincipalCache, hash_token
from autoscaler.state.db import transaction
from autoscaler.state.models import ApiToken
from tests.conftest import issue_token, make_context


def _revoke_in_database(ctx, token: str) -> None:
    # As another API process would (`server --workers N`): this process's cache is not told.
    with transaction(ctx.sessions) as s:
        s.execute(update(ApiToken).where(ApiToken.token_hash == hash_token(token)).values(revoked=True))


def test_revocation_elsewhere_takes_effect_within_the_ttl(ctx) -> None:
    ctx.principals = PrincipalCache(ttl_s=0.3)
    client = TestClient(create_app(ctx))
    token = issue_token(ctx, "team", team="vision")
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/whoami", headers=headers).status_code == 200
    _revoke_in_database(ctx, token)
    # Stale for at most ttl_s: the bound PrincipalCache documents.
    time.sleep(0.35)
    assert client.get("/api/v1/whoami", headers=headers).status_code == 401


def test_deregistration_revokes_at_once_in_this_process(ctx) -> None:
    ctx.principals = PrincipalCache(ttl_s=3600)  # even with a long TTL
    client = TestClient(create_app(ctx))
    join = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
    r = client.post(
        "/api/v1/workers/register",
        headers={"Authorization": f"Bearer {join}"},
        json={"hostname": "h", "instance_id": "i-c", "provider": "fake", "pool": "gpu-pool"},
    )
    wid, headers = r.json()["worker_id"], {"Authorization": f"Bearer {r.json()['worker_token']}"}
    assert client.post(f"/api/v1/workers/{wid}/heartbeat", headers=headers, json={}).status_code == 200
    assert client.post(f"/api/v1/workers/{wid}/deregister", headers=headers, json={}).status_code == 200
    assert client.post(f"/api/v1/workers/{wid}/heartbeat", headers=headers, json={}).status_code == 401


def test_expiry_is_never_served_from_the_cache(config, sessions, clock) -> None:
    # The server's clock is the test's: the token expires when the test says, not when a
    # loaded machine gets round to the first request (a 300 ms token once expired first).
    ctx = make_context(config, sessions, clock)
    ctx.principals = PrincipalCache(ttl_s=3600)
    client = TestClient(create_app(ctx))
    token = issue_token(ctx, "team", team="vision", ttl=timedelta(seconds=300))
    headers = {"Authorization": f"Bearer {token}"}
    assert client.get("/api/v1/whoami", headers=headers).status_code == 200
    clock.advance(299)
    assert client.get("/api/v1/whoami", headers=headers).status_code == 200  # cached, and still valid
    clock.advance(1)
    assert client.get("/api/v1/whoami", headers=headers).status_code == 401


def test_bad_tokens_are_not_cached_and_still_rate_limited(ctx) -> None:
    client = TestClient(create_app(ctx))
    codes = [client.get("/api/v1/tasks", headers={"Authorization": "Bearer nope"}).status_code for _ in range(25)]
    assert codes[0] == 401 and codes[-1] == 429
    assert len(ctx.principals._entries) == 0
