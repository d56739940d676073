"""The database goes away under load: PostgreSQL is restarted (every connection is
dropped, some mid-transaction) while clients enqueue, list and heartbeat.

Promises: no 500 (an outage is a 503 with a message saying to retry), the server
recovers by itself once the database is back, and no acknowledged write is lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select, text

from autoscaler.state.db import make_engine, session_factory, upgrade
from autoscaler.state.models import Task
from tests.conftest import LiveServer, issue_token, make_context
from tests.pgserver import PostgresServer


@pytest.fixture
def own_pg() -> Iterator[PostgresServer]:
    """A server of our own: restarting the shared one would disturb other tests."""
    server = PostgresServer()
    server.start()
    yield server
    server.stop()


def _load(
    url: str, headers: dict[str, str], worker: tuple[str, str], stop: threading.Event, out: dict[str, Any]
) -> None:
    wid, wtoken = worker
    with httpx.Client(base_url=url, timeout=30) as c:
        while not stop.is_set():
            for method, path, body, h in (
                ("POST", "/api/v1/tasks", {"queue": "cpu", "command": ["x"]}, headers),
                ("GET", "/api/v1/tasks?limit=5", None, headers),
                ("POST", f"/api/v1/workers/{wid}/heartbeat", {}, {"Authorization": f"Bearer {wtoken}"}),
            ):
                try:
                    r = c.request(method, path, json=body, headers=h)
                except httpx.HTTPError as exc:
                    out["transport"].append(repr(exc))
                    continue
                out["codes"].append(r.status_code)
                if r.status_code >= 500:
                    out["bodies"].append(r.json())
                if method == "POST" and path == "/api/v1/tasks" and r.status_code == 201:
                    out["acked"].append(r.json()["id"])


def test_postgres_restart_under_load(own_pg: PostgresServer, config: Any) -> None:
    admin = create_engine(own_pg.url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text("CREATE DATABASE fault"))
    admin.dispose()
    engine = make_engine(own_pg.url.rsplit("/", 1)[0] + "/fault")
    upgrade(engine)
    ctx = make_context(config, session_factory(engine))
    server = LiveServer(ctx).start()
    try:
        team = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
        join = issue_token(ctx, "join", pool="cpu-pool", ttl=timedelta(hours=1))
        reg = httpx.post(
            f"{server.url}/api/v1/workers/register",
            headers={"Authorization": f"Bearer {join}"},
            json={"hostname": "h", "instance_id": "i-1", "provider": "fake", "pool": "cpu-pool"},
        ).json()
        out: dict[str, Any] = {"codes": [], "bodies": [], "acked": [], "transport": []}
        stop = threading.Event()
        threads = [
            threading.Thread(target=_load, args=(server.url, team, (reg["worker_id"], reg["worker_token"]), stop, out))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)
        before = len(out["codes"])
        own_pg.restart()  # fast shutdown: open connections are terminated
        restarted_at = len(out["codes"])
        time.sleep(2.0)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        codes = out["codes"]
        assert before > 0 and len(codes) > restarted_at, "the load did not run"
        assert 500 not in codes, f"500s during the outage: {out['bodies'][:3]}"
        unavailable = [b for b in out["bodies"]]
        assert all("database" in b["detail"] and "retry" in b["detail"] for b in unavailable), unavailable[:3]
        assert not out["transport"], out["transport"][:3]
        # Recovered by itself: the last requests succeed.
        assert all(code < 400 for code in codes[-12:]), codes[-30:]
        with httpx.Client(base_url=server.url, timeout=10) as c:
            assert c.get("/api/v1/tasks?limit=1", headers=team).status_code == 200
        # Nothing acknowledged was lost.
        with ctx.sessions() as s:
            stored = set(s.scalars(select(Task.id)))
        missing = set(out["acked"]) - stored
        assert not missing, f"{len(missing)} acknowledged tasks lost"
        print(f"requests={len(codes)} 503s={codes.count(503)} acked={len(out['acked'])}")
    finally:
        server.stop()
        engine.dispose()
