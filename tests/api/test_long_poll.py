"""Long-poll leases (`POST /workers/{id}/lease?wait_s=N`, autoscaler.api.longpoll).

Promises tried here: a waiting lease is answered by the enqueue that gives it work
(not by its timeout, not by polling); work queued by another process reaches it
through the shared probe; a wait that runs out is the usual empty answer; errors
are those of a plain lease; waiting requests hold no database connection, so many
of them do not exhaust a small pool; and a stopping server answers them at once.

No assertion here is about speed: where a test needs to know that something
happened because of an event and not because a wait ran out, the wait is made far
longer than the test could ever take (the probe's interval an hour, a wait of a
minute) so the event is the only way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.api.context import AppContext
from autoscaler.api.longpoll import LeaseWaiters
from autoscaler.config import AutoscalerConfig
from autoscaler.queueing import tasks as task_ops
from autoscaler.state.db import make_engine, session_factory, transaction
from tests.conftest import TEST_CONFIG, LiveServer, free_port, issue_token, make_context

NEVER = 3600.0  # a probe interval or wait no test lasts: only an event can end it


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


class Rig:
    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.server = LiveServer(ctx).start()
        self.http = httpx.Client(base_url=self.server.url, timeout=120)
        self.admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}

    def register(self, n: int) -> tuple[str, dict[str, str]]:
        join = self.http.post("/api/v1/tokens", json={"kind": "join", "pool": "gpu-pool"}, headers=self.admin)
        reg = self.http.post(
            "/api/v1/workers/register",
            json={
                "hostname": f"h{n}",
                "instance_id": f"i-{n}",
                "provider": "fake",
                "pool": "gpu-pool",
                "gpus": [{"index": 0, "model": "A10G"}],
            },
            headers={"Authorization": f"Bearer {join.json()['token']}"},
        )
        assert reg.status_code == 201, reg.text
        return reg.json()["worker_id"], {"Authorization": f"Bearer {reg.json()['worker_token']}"}

    def enqueue(self, nodes: int = 1) -> str:
        r = self.http.post(
            "/api/v1/tasks",
            json={"queue": "gpu", "gpus": 1, "command": ["train"], "team": "vision", "nodes": nodes},
            headers=self.admin,
        )
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def lease(self, worker: tuple[str, dict[str, str]], wait_s: float | None = None) -> httpx.Response:
        wid, headers = worker
        query = "" if wait_s is None else f"?wait_s={wait_s}"
        # A client of its own: requests from several threads at once.
        with httpx.Client(base_url=self.server.url, timeout=120) as c:
            return c.post(f"/api/v1/workers/{wid}/lease{query}", headers=headers)

    def close(self) -> None:
        self.ctx.lease_waiters.close()  # a server in a thread gets no signal
        self.http.close()
        self.server.stop()


def _rig(config: AutoscalerConfig, sessions: sessionmaker[Session], **waiters: float) -> Rig:
    ctx = make_context(config, sessions)
    ctx.lease_waiters = LeaseWaiters(**waiters)
    return Rig(ctx)


@pytest.fixture
def rig(config: AutoscalerConfig, sessions: sessionmaker[Session]) -> Iterator[Rig]:
    r = _rig(config, sessions, recheck_s=NEVER)
    yield r
    r.close()


def test_a_waiting_lease_is_answered_by_the_enqueue(rig: Rig) -> None:
    worker = rig.register(0)
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(rig.lease, worker, 60)
        _wait_for("the lease to wait", lambda: len(rig.ctx.lease_waiters) == 1)
        assert not waiting.done()
        task_id = rig.enqueue()
        reply = waiting.result(timeout=30)  # long before its 60 s: the enqueue woke it
    assert reply.status_code == 200, reply.text
    assert reply.json()["task"]["id"] == task_id
    assert reply.json()["task"]["gpu_indices"] == [0]
    assert len(rig.ctx.lease_waiters) == 0


def test_work_already_queued_is_handed_out_without_waiting(rig: Rig) -> None:
    worker = rig.register(0)
    task_id = rig.enqueue()
    reply = rig.lease(worker, 60)
    assert reply.json()["task"]["id"] == task_id


def test_a_wait_that_runs_out_is_the_usual_empty_answer(rig: Rig) -> None:
    worker = rig.register(0)
    plain = rig.lease(worker)
    held = rig.lease(worker, 0.3)
    assert (
        (held.status_code, held.json())
        == (plain.status_code, plain.json())
        == (200, {"task": None, "reserved": False, "heartbeat": None})
    )


def test_one_enqueue_wakes_one_waiter_not_all(rig: Rig) -> None:
    workers = [rig.register(n) for n in range(4)]
    with ThreadPoolExecutor(4) as pool:
        waiting = [pool.submit(rig.lease, w, 60) for w in workers]
        _wait_for("four waiting leases", lambda: len(rig.ctx.lease_waiters) == 4)
        task_id = rig.enqueue()
        _wait_for("one lease answered", lambda: sum(f.done() for f in waiting) == 1)
        done = [f for f in waiting if f.done()]
        assert done[0].result().json()["task"]["id"] == task_id
        assert len(rig.ctx.lease_waiters) == 3  # the others went on waiting
        rig.ctx.lease_waiters.close()  # what a stop does: every waiter answers now
        rest = [f.result(timeout=30).json() for f in waiting if f is not done[0]]
    assert rest == [{"task": None, "reserved": False, "heartbeat": None}] * 3


def test_errors_while_waiting_are_those_of_a_plain_lease(rig: Rig) -> None:
    wid, headers = rig.register(0)
    other, _ = rig.register(1)
    for query in ("", "?wait_s=30"):
        bad = rig.http.post(f"/api/v1/workers/{wid}/lease{query}", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401, bad.text
        assert "invalid or expired token" in bad.json()["detail"]
        foreign = rig.http.post(f"/api/v1/workers/{other}/lease{query}", headers=headers)
        assert foreign.status_code == 404, foreign.text
        assert foreign.json()["detail"] == f"worker {other} is not registered"
    for wait in ("-1", "61", "soon"):
        r = rig.http.post(f"/api/v1/workers/{wid}/lease?wait_s={wait}", headers=headers)
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("invalid request: query.wait_s:")
    assert len(rig.ctx.lease_waiters) == 0


def test_work_queued_by_another_process_reaches_a_waiter_through_the_probe(
    config: AutoscalerConfig, sessions: sessionmaker[Session]
) -> None:
    r = _rig(config, sessions, recheck_s=0.05, cooldown_s=0.05)
    try:
        worker = r.register(0)
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(r.lease, worker, 60)
            _wait_for("the lease to wait", lambda: len(r.ctx.lease_waiters) == 1)
            # Straight into the database, as another server process would: no notify here.
            with transaction(sessions) as s:
                task = task_ops.enqueue(
                    s,
                    task_ops.TaskSpec(queue="gpu", command=["x"], gpus=1),
                    team="vision",
                    now=r.ctx.clock.now(),
                )
            reply = waiting.result(timeout=30)
        assert reply.json()["task"]["id"] == task.id
        assert r.ctx.lease_waiters.probes >= 1
    finally:
        r.close()


@pytest.mark.postgres
def test_many_waiting_leases_hold_no_database_connection(config: AutoscalerConfig, pg_url: str) -> None:
    # A pool of 2 with no overflow, and 24 leases waiting at once: if a waiting lease
    # held its connection, the 3rd would time out and so would everything else.
    engine = make_engine(pg_url, pool_size=2, max_overflow=0, pool_timeout=5)
    r = _rig(config, session_factory(engine), recheck_s=NEVER)
    try:
        workers = [r.register(n) for n in range(24)]
        with ThreadPoolExecutor(24) as pool:
            waiting: list[Future[httpx.Response]] = [pool.submit(r.lease, w, 60) for w in workers]
            _wait_for("24 waiting leases", lambda: len(r.ctx.lease_waiters) == 24)
            assert engine.pool.checkedout() == 0  # type: ignore[attr-defined]
            # The rest of the API still answers while they wait.
            wid, headers = workers[0]
            beat = r.http.post(f"/api/v1/workers/{wid}/heartbeat", json={}, headers=headers)
            assert beat.status_code == 200, beat.text
            ids = {r.enqueue() for _ in range(3)}
            _wait_for("three leases answered", lambda: sum(f.done() for f in waiting) == 3)
            got = {f.result().json()["task"]["id"] for f in waiting if f.done()}
            assert got == ids
            r.ctx.lease_waiters.close()
            assert all(f.result(timeout=30).status_code == 200 for f in waiting)
    finally:
        r.close()
        engine.dispose()


def _server(tmp_path: Path, db_url: str | None, workers: int) -> tuple[subprocess.Popen[bytes], str, Path]:
    home = tmp_path / "home"
    home.mkdir()
    cfg: dict[str, Any] = yaml.safe_load(TEST_CONFIG)
    if db_url:
        cfg["database_url"] = db_url
    config_path = tmp_path / "autoscaler.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    log = (tmp_path / "server.log").open("wb")
    argv = ["server", "--config", str(config_path), "--home", str(home), "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", *argv, "--workers", str(workers)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "AUTOSCALER_HOME": str(home)},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError((tmp_path / "server.log").read_text()[-2000:])
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("server did not start")
        time.sleep(0.1)
    return proc, url, home


@pytest.mark.parametrize(
    ("backend", "workers"), [("sqlite", 1), pytest.param("postgresql", 2, marks=pytest.mark.postgres)]
)
def test_a_stopping_server_answers_its_open_long_polls_at_once(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str, workers: int
) -> None:
    db_url = str(request.getfixturevalue("pg_url")) if backend == "postgresql" else None
    proc, url, home = _server(tmp_path, db_url, workers)
    try:
        admin = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
        with httpx.Client(base_url=url, timeout=120) as c:
            join = c.post("/api/v1/tokens", json={"kind": "join", "pool": "gpu-pool"}, headers=admin).json()["token"]
            reg = c.post(
                "/api/v1/workers/register",
                json={"hostname": "h", "instance_id": "i-1", "provider": "fake", "pool": "gpu-pool", "gpus": []},
                headers={"Authorization": f"Bearer {join}"},
            ).json()
        headers = {"Authorization": f"Bearer {reg['worker_token']}"}
        replies: list[httpx.Response] = []

        def hold() -> None:
            with httpx.Client(base_url=url, timeout=120) as c:
                replies.append(c.post(f"/api/v1/workers/{reg['worker_id']}/lease?wait_s=60", headers=headers))

        threads = [threading.Thread(target=hold) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # let them reach the server and park (nothing is queued)
        assert all(t.is_alive() for t in threads)
        proc.send_signal(signal.SIGTERM)
        # Without the release, uvicorn would wait out the 60 s of every open long-poll.
        proc.wait(timeout=30)
        for t in threads:
            t.join(timeout=30)
        assert [(r.status_code, r.json()) for r in replies] == [
            (200, {"task": None, "reserved": False, "heartbeat": None})
        ] * 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_rank_of_a_forming_gang_is_answered_at_once(rig: Rig) -> None:
    """A worker holding a rank of a gang still forming must not sit in a long-poll: its
    start comes on a lease as soon as the last rank is reserved (docs/gangs.md)."""
    worker = rig.register(0)
    rig.enqueue(nodes=2)
    t0 = time.monotonic()
    reply = rig.lease(worker, 30)
    assert reply.json() == {"task": None, "reserved": True, "heartbeat": None}
    assert time.monotonic() - t0 < 15, "the reserved rank waited in the long-poll"
