"""One-time, launch-bound join tokens and visible security events, against a live server
on SQLite and PostgreSQL.

- a join token registers once; a replay (same or another instance id, concurrently or
  later) is refused and recorded;
- a token minted for a launch registers only that launch's provider and instance;
  a registration claiming another pool's instance is refused;
- a restarted agent re-registers with its worker token (rotated; the old one is spent);
- the same agent process may retry a join whose answer it lost (its retry key);
- refusals, replays and authorization failures are rows in security_events, counted in
  /metrics and listed on the admin page, and no token is ever written there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from autoscaler.api.context import AppContext
from autoscaler.auth.tokens import create_token
from autoscaler.state.db import transaction
from autoscaler.state.models import ApiToken, Instance, SecurityEvent, Worker, new_id
from tests.conftest import LiveServer, issue_token

POOL = "gpu-pool"


@pytest.fixture
def server(live_server: LiveServer) -> LiveServer:
    return live_server


@pytest.fixture
def admin(server: LiveServer, admin_token: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=10) as c:
        yield c


def body(instance_id: str, *, pool: str = POOL, provider: str = "fake", **extra: Any) -> dict[str, Any]:
    return {
        "hostname": f"host-{instance_id}",
        "instance_id": instance_id,
        "provider": provider,
        "pool": pool,
        "gpus": [{"index": 0, "model": "A10G", "memory_mb": 24000}],
        **extra,
    }


def register(url: str, token: str, instance_id: str, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/workers/register",
        json=body(instance_id, **kw),
        headers={"Authorization": f"Bearer {token}"},
        timeout=20,
    )


def join_token(ctx: AppContext, pool: str = POOL) -> str:
    return issue_token(ctx, "join", pool=pool, ttl=timedelta(minutes=30))


def launch(ctx: AppContext, *, pool: str = POOL, provider_instance_id: str | None = None) -> tuple[str, str]:
    """An Instance row as the reconciler records a launch, and the join token it mints
    for it (bound to the request id and provider). Returns (request id, token)."""
    now = ctx.clock.now()
    request_id = new_id()
    with transaction(ctx.sessions) as s:
        s.add(
            Instance(
                request_id=request_id,
                provider="fake",
                pool=pool,
                instance_type="g.1",
                capacity_type="on_demand",
                provider_instance_id=provider_instance_id,
                state="booting" if provider_instance_id else "launching",
                created_at=now,
                updated_at=now,
            )
        )
        plaintext, _ = create_token(
            s, kind="join", now=now, pool=pool, ttl=timedelta(minutes=16), request_id=request_id, provider="fake"
        )
    return request_id, plaintext


def events(ctx: AppContext, kind: str | None = None) -> list[SecurityEvent]:
    with ctx.sessions() as s:
        stmt = select(SecurityEvent).order_by(SecurityEvent.id)
        if kind is not None:
            stmt = stmt.where(SecurityEvent.kind == kind)
        rows = list(s.scalars(stmt))
        for r in rows:
            s.expunge(r)
        return rows


def assert_no_token_in_events(ctx: AppContext, *tokens: str) -> None:
    for e in events(ctx):
        row = " ".join(str(getattr(e, c.name)) for c in SecurityEvent.__table__.columns)
        for t in tokens:
            assert t not in row and t[8:20] not in row, f"token material in security event {e.id}"


def metric(admin: httpx.Client, name: str, **labels: str) -> float:
    text = admin.get("/metrics").text
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            series, _, value = line.rpartition(" ")
            got = series[len(name) :].strip("{}")
            if ",".join(sorted(got.split(","))) == want or (not labels and not got):
                return float(value)
    return 0.0


def test_join_token_registers_once_replays_are_refused_and_recorded(server: LiveServer, admin: httpx.Client) -> None:
    token = join_token(server.ctx)
    first = register(server.url, token, "i-first")
    assert first.status_code == 201, first.text
    worker_token = first.json()["worker_token"]

    # Later, the same instance id (a root task that read the bootstrap) and another one.
    same = register(server.url, token, "i-first")
    other = register(server.url, token, "i-second")
    assert same.status_code == other.status_code == 403
    assert "already used" in same.text and "already used" in other.text
    # The real agent's worker is untouched and its token still works.
    w = admin.get(f"/api/v1/workers/{first.json()['worker_id']}").json()
    assert w["state"] == "idle"
    hb = httpx.post(
        f"{server.url}/api/v1/workers/{w['id']}/heartbeat",
        json={},
        headers={"Authorization": f"Bearer {worker_token}"},
        timeout=10,
    )
    assert hb.status_code == 200, hb.text
    live = [x for x in admin.get("/api/v1/workers").json() if x["instance_id"].startswith("i-")]
    assert len(live) == 1

    replays = events(server.ctx, "join_replay")
    assert [(e.instance_id, e.token_kind, e.pool) for e in replays] == [
        ("i-first", "join", POOL),
        ("i-second", "join", POOL),
    ]
    with server.ctx.sessions() as s:
        row = s.scalar(select(ApiToken).where(ApiToken.kind == "join"))
        assert row is not None and row.used_at is not None and row.bound_instance == "i-first"
        assert all(e.token_id == row.id for e in replays)
    assert_no_token_in_events(server.ctx, token, worker_token)
    assert metric(admin, "autoscaler_security_events_total", kind="join_replay", token_kind="join") == 2


def test_concurrent_replays_one_registration_wins(server: LiveServer) -> None:
    token = join_token(server.ctx)
    n = 8
    barrier = threading.Barrier(n)
    codes: list[int] = []
    lock = threading.Lock()

    def attempt(i: int) -> None:
        barrier.wait()
        # Half claim the same instance id, half another each.
        r = register(server.url, token, "i-race" if i % 2 else f"i-race-{i}")
        with lock:
            codes.append(r.status_code)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(codes) == [201] + [403] * (n - 1), codes
    with server.ctx.sessions() as s:
        workers = list(s.scalars(select(Worker)))
    assert len(workers) == 1 and workers[0].state == "idle"
    assert len(events(server.ctx, "join_replay")) == n - 1


def test_launch_bound_token_registers_only_its_instance(server: LiveServer) -> None:
    ctx = server.ctx
    request_id, token = launch(ctx, provider_instance_id="i-real")
    wrong_id = register(server.url, token, "i-impostor")
    assert wrong_id.status_code == 403 and "does not match the launch" in wrong_id.text
    wrong_provider = register(server.url, token, "i-real", provider="local")
    assert wrong_provider.status_code == 403
    # Refusals do not spend the token: the real machine still registers, and is linked.
    ok = register(server.url, token, "i-real")
    assert ok.status_code == 201, ok.text
    with ctx.sessions() as s:
        inst = s.scalar(select(Instance).where(Instance.request_id == request_id))
        assert inst is not None and inst.worker_id == ok.json()["worker_id"]
    refused = events(ctx, "registration_refused")
    assert [e.instance_id for e in refused] == ["i-impostor", "i-real"]
    assert "launch" in refused[0].detail and "provider" in refused[1].detail
    # Spent now: whatever it claims next is a replay.
    assert register(server.url, token, "i-impostor").status_code == 403
    assert [e.instance_id for e in events(ctx, "join_replay")] == ["i-impostor"]

    # A launch the provider has not reported yet: the claim is taken, once.
    _, early = launch(ctx)
    assert register(server.url, early, "i-early").status_code == 201
    assert register(server.url, early, "i-early").status_code == 403


def test_registration_claiming_another_pools_instance_is_refused(server: LiveServer) -> None:
    ctx = server.ctx
    launch(ctx, pool="cpu-pool", provider_instance_id="i-cpu-1")
    # A plain join token of gpu-pool, and a gpu-pool launch not yet reported, both claim it.
    plain = join_token(ctx, POOL)
    r = register(server.url, plain, "i-cpu-1")
    assert r.status_code == 403 and "another launch" in r.text
    _, bound = launch(ctx, pool=POOL)
    r = register(server.url, bound, "i-cpu-1")
    assert r.status_code == 403 and "another launch" in r.text
    # A gpu-pool token presented for cpu-pool is refused too.
    r = register(server.url, plain, "i-cpu-1", pool="cpu-pool")
    assert r.status_code == 403 and "for pool 'gpu-pool'" in r.text
    refused = events(ctx, "registration_refused")
    assert len(refused) == 3 and all(e.instance_id == "i-cpu-1" for e in refused)
    with ctx.sessions() as s:
        assert s.scalar(select(Worker).limit(1)) is None


def test_worker_token_reregisters_and_is_rotated(server: LiveServer, admin: httpx.Client) -> None:
    token = join_token(server.ctx)
    first = register(server.url, token, "i-restart").json()
    # The agent restarted: its worker token, not the (spent) join token.
    again = register(server.url, first["worker_token"], "i-restart")
    assert again.status_code == 201, again.text
    second = again.json()
    assert second["worker_id"] != first["worker_id"] and second["worker_token"] != first["worker_token"]
    old = admin.get(f"/api/v1/workers/{first['worker_id']}").json()
    assert old["state"] == "gone" and old["gone_reason"] == "re-registered"
    # The old worker token is spent: it neither acts nor re-registers again.
    replay = register(server.url, first["worker_token"], "i-restart")
    assert replay.status_code == 401
    hb = httpx.post(
        f"{server.url}/api/v1/workers/{first['worker_id']}/heartbeat",
        json={},
        headers={"Authorization": f"Bearer {first['worker_token']}"},
        timeout=10,
    )
    assert hb.status_code == 401
    # A worker token re-registers only its own machine.
    elsewhere = register(server.url, second["worker_token"], "i-someone-else")
    assert elsewhere.status_code == 403 and "only its own machine" in elsewhere.text
    other_pool = register(server.url, second["worker_token"], "i-restart", pool="cpu-pool")
    assert other_pool.status_code == 403
    assert admin.get(f"/api/v1/workers/{second['worker_id']}").json()["state"] == "idle"
    assert len(events(server.ctx, "registration_refused")) == 2
    assert [e.token_kind for e in events(server.ctx, "auth_failed")] == ["worker", "worker"]

    # Two re-registrations racing with one worker token: one wins.
    n = 6
    barrier = threading.Barrier(n)
    codes: list[int] = []

    def attempt() -> None:
        barrier.wait()
        codes.append(register(server.url, second["worker_token"], "i-restart").status_code)

    threads = [threading.Thread(target=attempt) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert codes.count(201) == 1 and all(c in (401, 403) for c in codes if c != 201), codes
    live = [w for w in admin.get("/api/v1/workers").json() if w["instance_id"] == "i-restart"]
    assert len(live) == 1
    assert_no_token_in_events(server.ctx, token, first["worker_token"], second["worker_token"])


def test_the_same_agent_process_may_retry_a_lost_answer(server: LiveServer, admin: httpx.Client) -> None:
    token = join_token(server.ctx)
    key = "k" * 32
    first = register(server.url, token, "i-retry", retry_key=key)
    assert first.status_code == 201
    # The answer was lost: the same process retries with its key and gets a fresh worker.
    retry = register(server.url, token, "i-retry", retry_key=key)
    assert retry.status_code == 201, retry.text
    assert admin.get(f"/api/v1/workers/{first.json()['worker_id']}").json()["state"] == "gone"
    # Without the key, with another key, or for another instance: a replay.
    assert register(server.url, token, "i-retry").status_code == 403
    assert register(server.url, token, "i-retry", retry_key="x" * 32).status_code == 403
    assert register(server.url, token, "i-other", retry_key=key).status_code == 403
    assert len(events(server.ctx, "join_replay")) == 3


def test_authorization_failures_are_recorded_per_token(
    server: LiveServer, admin: httpx.Client, admin_token: str
) -> None:
    ctx = server.ctx
    team = issue_token(ctx, "team", team="vision")
    a = register(server.url, join_token(ctx), "i-a").json()
    b = register(server.url, join_token(ctx), "i-b").json()
    h = {"Authorization": f"Bearer {team}"}
    assert httpx.get(f"{server.url}/api/v1/workers", headers=h, timeout=10).status_code == 403
    assert register(server.url, team, "i-c").status_code == 403
    # Worker a's token used for worker b: 404 to the caller, an event to the admins.
    r = httpx.post(
        f"{server.url}/api/v1/workers/{b['worker_id']}/heartbeat",
        json={},
        headers={"Authorization": f"Bearer {a['worker_token']}"},
        timeout=10,
    )
    assert r.status_code == 404
    bogus = "asw_" + "x" * 43
    assert (
        httpx.get(f"{server.url}/api/v1/tasks", headers={"Authorization": f"Bearer {bogus}"}, timeout=10).status_code
        == 401
    )
    with ctx.sessions() as s:
        team_id = s.scalar(select(ApiToken.id).where(ApiToken.kind == "team"))
        a_id = s.scalar(select(ApiToken.id).where(ApiToken.worker_id == a["worker_id"], ApiToken.kind == "worker"))
    forbidden = events(ctx, "forbidden")
    assert [(e.token_id, e.token_kind) for e in forbidden] == [
        (team_id, "team"),
        (team_id, "team"),
        (a_id, "worker"),
    ]
    assert forbidden[2].worker_id == a["worker_id"] and b["worker_id"] in forbidden[2].detail
    unknown = events(ctx, "auth_failed")
    assert len(unknown) == 1 and unknown[0].token_id is None and unknown[0].client == "127.0.0.1"
    assert_no_token_in_events(ctx, team, bogus, a["worker_token"], b["worker_token"], admin_token)

    assert metric(admin, "autoscaler_security_events_total", kind="forbidden", token_kind="team") == 2
    assert metric(admin, "autoscaler_security_events_total", kind="forbidden", token_kind="worker") == 1
    assert metric(admin, "autoscaler_security_events_total", kind="auth_failed", token_kind="") == 1
    assert metric(admin, "autoscaler_token_security_events_total", token_id=team_id or "", token_kind="team") == 2
    # Every kind has a series, even before its first event.
    assert 'autoscaler_security_events_total{kind="join_replay",token_kind=""} 0.0' in admin.get("/metrics").text
    # A team's scrape shows none of it.
    assert "autoscaler_security_events" not in httpx.get(f"{server.url}/metrics", headers=h, timeout=10).text


def test_admin_page_lists_security_events(server: LiveServer, admin_token: str) -> None:
    ctx = server.ctx
    token = join_token(ctx)
    register(server.url, token, "i-page")
    assert register(server.url, token, "i-page-replay").status_code == 403
    team = issue_token(ctx, "team", team="vision")
    with httpx.Client(base_url=server.url, timeout=10) as web:
        assert web.post("/login", data={"token": admin_token, "next": "/admin"}).status_code == 303
        page = web.get("/admin")
        assert page.status_code == 200
        assert 'href="/admin"' in page.text and 'id="security-events"' in page.text
        assert 'data-kind="join_replay"' in page.text and "i-page-replay" in page.text
        assert token not in page.text and token[8:20] not in page.text
    with httpx.Client(base_url=server.url, timeout=10) as web:
        web.post("/login", data={"token": team, "next": "/"})
        refused = web.get("/admin")
        assert refused.status_code == 403 and "i-page-replay" not in refused.text
        assert 'href="/admin"' not in web.get("/").text


def test_expired_and_revoked_join_tokens_are_recorded(server: LiveServer) -> None:
    ctx = server.ctx
    now = datetime.now(UTC)
    with transaction(ctx.sessions) as s:
        expired, row = create_token(s, kind="join", now=now - timedelta(hours=2), pool=POOL, ttl=timedelta(hours=1))
        expired_id = row.id
    assert register(server.url, expired, "i-late").status_code == 401
    (e,) = events(ctx, "auth_failed")
    assert e.token_id == expired_id and "expired join token" in e.detail


def test_an_early_registration_the_provider_contradicts_is_expelled(server: LiveServer, admin: httpx.Client) -> None:
    """A launch's token used before the provider reported the instance id: when the
    reconciler records the id (`_record_launched` calls `expel_impostors`) and it is not
    the one claimed, that worker is deregistered and the mismatch recorded."""
    from autoscaler.queueing.workers import expel_impostors

    ctx = server.ctx
    request_id, token = launch(ctx)
    early = register(server.url, token, "i-claimed")
    assert early.status_code == 201
    with transaction(ctx.sessions) as s:
        inst = s.scalar(select(Instance).where(Instance.request_id == request_id))
        assert inst is not None
        inst.provider_instance_id = "i-actual"
        assert expel_impostors(s, inst, now=ctx.clock.now()) == [early.json()["worker_id"]]
    w = admin.get(f"/api/v1/workers/{early.json()['worker_id']}").json()
    assert w["state"] == "gone" and w["gone_reason"] == "impostor"
    ctx.principals.forget_worker(w["id"])  # another API process would follow within the cache TTL
    hb = httpx.post(
        f"{server.url}/api/v1/workers/{w['id']}/heartbeat",
        json={},
        headers={"Authorization": f"Bearer {early.json()['worker_token']}"},
        timeout=10,
    )
    assert hb.status_code == 401
    (mismatch,) = events(ctx, "launch_mismatch")
    assert mismatch.instance_id == "i-claimed" and "i-actual" in mismatch.detail
    # A registration the provider confirms is left alone.
    request_id, token = launch(ctx)
    assert register(server.url, token, "i-right").status_code == 201
    with transaction(ctx.sessions) as s:
        inst = s.scalar(select(Instance).where(Instance.request_id == request_id))
        assert inst is not None
        inst.provider_instance_id = "i-right"
        assert expel_impostors(s, inst, now=ctx.clock.now()) == []


def test_a_terminated_instances_worker_token_cannot_reregister(server: LiveServer) -> None:
    ctx = server.ctx
    request_id, token = launch(ctx, provider_instance_id="i-term")
    first = register(server.url, token, "i-term").json()
    with transaction(ctx.sessions) as s:
        inst = s.scalar(select(Instance).where(Instance.request_id == request_id))
        assert inst is not None and inst.worker_id == first["worker_id"]
        inst.state = "terminated"
    r = register(server.url, first["worker_token"], "i-term")
    assert r.status_code == 403 and "terminated" in r.text
    (e,) = events(ctx, "registration_refused")
    assert e.token_kind == "worker" and e.worker_id == first["worker_id"]


def test_the_reconciler_mints_launch_bound_tokens(server: LiveServer) -> None:
    """The user-data of a launch carries a join token recorded with that launch's request
    id and provider, which then registers only that launch's instance."""
    from autoscaler.reconciler.component import bootstrap_user_data
    from providers.bootstrap import parse_user_data

    ctx = server.ctx
    config = ctx.config.model_copy(
        update={"pools": [p.model_copy(update={"provider": "local"}) for p in ctx.config.pools]}
    )
    pool = config.pool(POOL)
    assert pool is not None
    render = bootstrap_user_data(config, ctx.clock.now)
    now = ctx.clock.now()
    request_id = new_id()
    with transaction(ctx.sessions) as s:
        s.add(
            Instance(
                request_id=request_id,
                provider="local",
                pool=POOL,
                instance_type="g.1",
                capacity_type="on_demand",
                provider_instance_id="local-1",
                state="booting",
                created_at=now,
                updated_at=now,
            )
        )
        token = str(parse_user_data(render(s, pool, request_id))["join_token"])
    with ctx.sessions() as s:
        row = s.scalar(select(ApiToken).where(ApiToken.kind == "join"))
        assert row is not None and (row.request_id, row.provider, row.pool) == (request_id, "local", POOL)
        assert row.expires_at is not None
    assert register(server.url, token, "local-2", provider="local").status_code == 403
    assert register(server.url, token, "local-1", provider="local").status_code == 201
