"""SQL statements per agent request on the hot paths, pinned (issue 20, item 3).

A statement is a round trip to the database; heartbeats and empty leases are most of
an idle fleet's requests, so their counts are part of the contract: a change that adds
one fails here and has to say why. Counts are deterministic (no timing). Transaction
control is left out: SQLite's `BEGIN IMMEDIATE` is a statement, PostgreSQL's BEGIN is
the driver's, and both backends must show the same counts.

Through the real app (ASGI, real database, the principal cache warm as it is for a
live agent), on SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event

from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from tests.conftest import issue_token

# Per request, after the first (the principal cache is then warm).
PINNED = {
    "heartbeat, idle": 2,  # touch the worker (UPDATE ... RETURNING), what it holds (one SELECT)
    "heartbeat, busy": 2,
    "empty lease": 2,  # the probe for queued work or a gang start, the gang-wait flag
    # An idle agent's one request per interval: the heartbeat's 2 and the empty lease's 2
    # (a long-poll's first attempt; a wake-up's retry is a plain lease's 2).
    "lease carrying a heartbeat, nothing queued": 4,
    "lease that takes a task": 20,
    "start": 3,
    "logs": 2,
    # The task's row, end and event, its attempt's row and end (6); then the worker's row,
    # whether it holds a gang rank or runs another task, and its move to idle (4).
    "finish": 10,
}


class Counter:
    def __init__(self, engine: Engine) -> None:
        self.statements: list[str] = []
        event.listen(engine, "before_cursor_execute", self._seen)
        self.engine = engine

    def _seen(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            self.statements.append(" ".join(statement.split())[:1000])

    @contextmanager
    def count(self) -> Iterator[list[str]]:
        self.statements.clear()
        seen: list[str] = []
        yield seen
        seen.extend(self.statements)

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


@pytest.fixture
def counter(engine: Engine) -> Iterator[Counter]:
    c = Counter(engine)
    yield c
    c.close()


def _agent(client: TestClient, ctx: AppContext, instance: str) -> tuple[str, dict[str, str]]:
    join = issue_token(ctx, "join", pool="gpu-pool")
    reg = client.post(
        "/api/v1/workers/register",
        json={
            "hostname": "h",
            "instance_id": instance,
            "provider": "fake",
            "pool": "gpu-pool",
            "gpus": [{"index": 0, "model": "A10G"}],
        },
        headers={"Authorization": f"Bearer {join}"},
    )
    assert reg.status_code == 201, reg.text
    return reg.json()["worker_id"], {"Authorization": f"Bearer {reg.json()['worker_token']}"}


def test_statements_per_hot_request_are_pinned(ctx: AppContext, counter: Counter) -> None:
    client = TestClient(create_app(ctx))
    admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}
    wid, w = _agent(client, ctx, "i-1")
    base = f"/api/v1/workers/{wid}"
    idle = {"running": [], "gpu_metrics": []}
    assert client.post(f"{base}/heartbeat", json=idle, headers=w).status_code == 200  # warms the principal cache
    got: dict[str, int] = {}

    def measure(name: str, method: str, path: str, body: Any = None) -> Any:
        with counter.count() as seen:
            r = client.request(method, path, json=body, headers=w)
        assert r.status_code == 200, (name, r.text)
        got[name] = len(seen)
        return r.json()

    measure("heartbeat, idle", "POST", f"{base}/heartbeat", idle)
    assert measure("empty lease", "POST", f"{base}/lease")["task"] is None
    # Without wait_s: a long-poll's further attempts depend on timing, its first does not.
    out = measure("lease carrying a heartbeat, nothing queued", "POST", f"{base}/lease", {"heartbeat": idle})
    assert out["task"] is None and out["heartbeat"]["shutdown"] is False
    r = client.post("/api/v1/tasks", json={"queue": "gpu", "gpus": 1, "command": ["x"]}, headers=admin)
    tid = r.json()["id"]
    assert measure("lease that takes a task", "POST", f"{base}/lease")["task"]["id"] == tid
    measure("start", "POST", f"{base}/tasks/{tid}/start")
    measure("heartbeat, busy", "POST", f"{base}/heartbeat", {"running": [tid], "gpu_metrics": []})
    measure("logs", "POST", f"{base}/tasks/{tid}/logs", {"chunks": [{"stream": "stdout", "data": "hi"}]})
    assert measure("finish", "POST", f"{base}/tasks/{tid}/finish", {"reason": "exit", "exit_code": 0})["state"] == (
        "succeeded"
    )
    assert got == PINNED


def test_a_heartbeat_is_one_update_and_one_select(ctx: AppContext, counter: Counter) -> None:
    """What the two statements are: a heartbeat reads no ORM rows and locks nothing else."""
    client = TestClient(create_app(ctx))
    wid, w = _agent(client, ctx, "i-2")
    client.post(f"/api/v1/workers/{wid}/heartbeat", json={}, headers=w)
    with counter.count() as seen:
        assert client.post(f"/api/v1/workers/{wid}/heartbeat", json={}, headers=w).status_code == 200
    assert [s.split()[0] for s in seen] == ["UPDATE", "SELECT"]
    assert "RETURNING" in seen[0]
