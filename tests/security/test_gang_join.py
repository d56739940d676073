"""A gang launch's join token, against a live server on SQLite and PostgreSQL.

One cloud call starts the k machines of a gang launch with one user-data, so they
share one join token. The promise stays "a join token registers one machine, once",
per machine: the token registers exactly k machines, each a distinct instance of that
launch. Tried here: the same instance again (a replay), the k+1-th machine, an
instance id not of that launch, concurrent registrations for the last slot and for
the same instance, the agent's own retry, and a machine that claimed an id before the
provider reported the launch's ids (expelled once they are known).
"""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select

from autoscaler.api.context import AppContext
from autoscaler.auth.tokens import create_token
from autoscaler.queueing import workers as worker_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import ApiToken, Instance, JoinUse, Worker, new_id
from tests.conftest import LiveServer
from tests.security.test_one_time_join import POOL, events, register


@pytest.fixture
def server(live_server: LiveServer) -> LiveServer:
    return live_server


def gang_launch(ctx: AppContext, ids: list[str | None]) -> tuple[str, str]:
    """k Instance rows of one gang launch as the reconciler records them, and the token
    it mints for the launch (k uses). Returns (the launch's request id, the token)."""
    now = ctx.clock.now()
    launch_request_id = new_id()
    with transaction(ctx.sessions) as s:
        for n, pid in enumerate(ids):
            s.add(
                Instance(
                    request_id=launch_request_id if n == 0 else new_id(),
                    launch_request_id=launch_request_id,
                    gang_id="gang-1",
                    provider="fake",
                    pool=POOL,
                    instance_type="g.1",
                    capacity_type="on_demand",
                    provider_instance_id=pid,
                    state="booting" if pid else "launching",
                    created_at=now,
                    updated_at=now,
                )
            )
        plaintext, _ = create_token(
            s,
            kind="join",
            now=now,
            pool=POOL,
            ttl=timedelta(minutes=16),
            request_id=launch_request_id,
            provider="fake",
            max_uses=len(ids),
        )
    return launch_request_id, plaintext


def uses(ctx: AppContext) -> tuple[int, int]:
    with ctx.sessions() as s:
        row = s.scalar(select(ApiToken).where(ApiToken.kind == "join"))
        assert row is not None
        return row.uses, len(list(s.scalars(select(JoinUse))))


def test_each_machine_of_the_launch_registers_once_and_a_replay_is_refused(server: LiveServer) -> None:
    ctx = server.ctx
    _, token = gang_launch(ctx, ["i-a", "i-b"])
    a = register(server.url, token, "i-a")
    b = register(server.url, token, "i-b")
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    replay = register(server.url, token, "i-a")
    assert replay.status_code == 403 and "already used by this machine" in replay.text
    with ctx.sessions() as s:
        rows = {i.provider_instance_id: i.worker_id for i in s.scalars(select(Instance))}
    assert rows == {"i-a": a.json()["worker_id"], "i-b": b.json()["worker_id"]}
    assert [e.instance_id for e in events(ctx, "join_replay")] == ["i-a"]
    assert uses(ctx) == (2, 2)


def test_the_k_plus_first_machine_is_refused(server: LiveServer) -> None:
    ctx = server.ctx
    _, token = gang_launch(ctx, [None, None])  # ids not reported yet: claims taken on trust
    assert register(server.url, token, "i-1").status_code == 201
    assert register(server.url, token, "i-2").status_code == 201
    third = register(server.url, token, "i-3")
    assert third.status_code == 403 and "all 2 machines" in third.text
    assert [e.instance_id for e in events(ctx, "join_replay")] == ["i-3"]
    assert uses(ctx) == (2, 2)


def test_an_instance_not_of_the_launch_is_refused_and_spends_nothing(server: LiveServer) -> None:
    ctx = server.ctx
    _, token = gang_launch(ctx, ["i-a", "i-b"])
    foreign = register(server.url, token, "i-foreign")
    assert foreign.status_code == 403 and "not one of them" in foreign.text
    assert [e.instance_id for e in events(ctx, "registration_refused")] == ["i-foreign"]
    assert uses(ctx) == (0, 0)
    assert register(server.url, token, "i-a").status_code == 201
    assert register(server.url, token, "i-b").status_code == 201


def _race(url: str, token: str, claims: list[str]) -> list[int]:
    barrier = threading.Barrier(len(claims))
    codes: list[int] = []
    lock = threading.Lock()

    def attempt(instance_id: str) -> None:
        barrier.wait()
        r = register(url, token, instance_id)
        with lock:
            codes.append(r.status_code)

    threads = [threading.Thread(target=attempt, args=(c,)) for c in claims]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sorted(codes)


def test_concurrent_registrations_for_the_last_slot_one_wins(server: LiveServer) -> None:
    ctx = server.ctx
    _, token = gang_launch(ctx, [None, None])
    assert register(server.url, token, "i-first").status_code == 201
    n = 6
    assert _race(server.url, token, [f"i-race-{i}" for i in range(n)]) == [201] + [403] * (n - 1)
    assert uses(ctx) == (2, 2)
    with ctx.sessions() as s:
        assert len(list(s.scalars(select(Worker)))) == 2


def test_concurrent_registrations_of_one_instance_one_wins(server: LiveServer) -> None:
    ctx = server.ctx
    _, token = gang_launch(ctx, [None, None, None])
    n = 6
    assert _race(server.url, token, ["i-same"] * n) == [201] + [403] * (n - 1)
    assert uses(ctx) == (1, 1)  # the losers took no slot
    with ctx.sessions() as s:
        assert [w.instance_id for w in s.scalars(select(Worker))] == ["i-same"]


def test_the_agent_process_may_retry_with_its_retry_key(server: LiveServer) -> None:
    ctx = server.ctx
    _, token = gang_launch(ctx, ["i-a", "i-b"])
    key = "k" * 32
    first = register(server.url, token, "i-a", retry_key=key)
    retry = register(server.url, token, "i-a", retry_key=key)
    assert first.status_code == retry.status_code == 201, retry.text
    assert register(server.url, token, "i-a", retry_key="x" * 32).status_code == 403
    assert uses(ctx) == (1, 1)  # the retry spent no slot: i-b still registers
    assert register(server.url, token, "i-b").status_code == 201
    with ctx.sessions() as s:
        live = sorted(w.instance_id for w in s.scalars(select(Worker).where(Worker.state == "idle")))
    assert live == ["i-a", "i-b"]


def test_a_claim_made_before_the_ids_were_known_is_expelled_once_they_are(server: LiveServer) -> None:
    ctx = server.ctx
    launch_request_id, token = gang_launch(ctx, [None, None])
    fake = register(server.url, token, "i-fake")
    real = register(server.url, token, "i-real-1")
    assert fake.status_code == real.status_code == 201
    now = ctx.clock.now()
    with transaction(ctx.sessions) as s:
        rows = list(s.scalars(select(Instance).where(Instance.launch_request_id == launch_request_id)))
        expelled: list[str] = []
        for row, pid in zip(rows, ["i-real-1", "i-real-2"], strict=True):
            row.provider_instance_id = pid
            s.flush()
            expelled += worker_ops.expel_impostors(s, row, now=now)
    assert expelled == [fake.json()["worker_id"]]
    with ctx.sessions() as s:
        states = {w.instance_id: w.state for w in s.scalars(select(Worker))}
    assert states["i-fake"] == "gone" and states["i-real-1"] == "idle"
    assert [e.instance_id for e in events(ctx, "launch_mismatch")] == ["i-fake"]
