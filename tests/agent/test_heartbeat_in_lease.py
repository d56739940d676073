"""An idle agent's heartbeat rides its long-poll lease (issue 20, item 3).

Real agent processes against the real server; the server counts the requests it
serves by endpoint. Promises tried: an idle agent sends no heartbeat of its own, one
lease per heartbeat interval (before: a heartbeat and a long-poll per interval, twice
the requests), and its worker stays alive on those leases alone; a worker that stops
sending them is still marked lost, and told so when it comes back; a drain reaches an
agent that only long-polls; an agent with a task heartbeats on its own as before,
and a task's last output goes with its finish (one request, not two).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from autoscaler.api.context import AppContext
from tests.agent.conftest import AgentHarness, py, wait_for
from tests.conftest import LiveServer

H = 1.0  # the agents' heartbeat interval here
IDLE = ["--heartbeat-interval", str(H), "--lease-wait", "20", "--lease-interval", "0.2"]


class CountingApp:
    """The app, counting the agents' requests (POST /api/v1/workers/...) by their last
    path segment; the test's own admin reads are not counted."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/api/v1/workers/"):
            with self._lock:
                self.calls[scope["path"].rstrip("/").rsplit("/", 1)[-1]] += 1
        await self.app(scope, receive, send)

    def snapshot(self) -> Counter[str]:
        with self._lock:
            return Counter(self.calls)


@pytest.fixture
def counted(ctx: AppContext, tmp_path: Path) -> Iterator[tuple[AgentHarness, CountingApp]]:
    server = LiveServer(ctx)
    app = CountingApp(server.app)
    server._server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=server.port, log_level="warning", lifespan="off")
    )
    server._thread = threading.Thread(target=server._server.run, daemon=True)
    server.start()
    harness = AgentHarness(server, tmp_path)
    yield harness, app
    harness.close()
    server.stop()


def _heartbeat_age_s(harness: AgentHarness, worker_id: str) -> float:
    last = harness.worker_row(worker_id).last_heartbeat
    return (harness.ctx.clock.now() - last).total_seconds()


def test_an_idle_agent_makes_one_request_per_heartbeat_interval(counted: tuple[AgentHarness, CountingApp]) -> None:
    harness, app = counted
    agent = harness.start_agent(instance_id="i-idle", extra=IDLE)
    worker = harness.worker_of("i-idle")
    wait_for("the agent's long-poll", lambda: len(harness.ctx.lease_waiters) == 1, timeout=30)
    before, t0 = app.snapshot(), time.monotonic()
    ages = []
    while time.monotonic() - t0 < 8 * H:
        ages.append(_heartbeat_age_s(harness, worker["id"]))
        time.sleep(H / 4)
    window = time.monotonic() - t0
    during = app.snapshot() - before
    intervals = window / H
    # Before: a heartbeat and a long-poll every interval (2 per interval).
    assert during["heartbeat"] == 0, during
    assert 0.5 * intervals <= during["lease"] <= 1.3 * intervals + 1, (during, intervals)
    assert sum(during.values()) <= 1.3 * intervals + 1, during
    # The worker stays alive on its leases alone: never silent for much more than an interval.
    assert max(ages) < 2.5 * H, ages
    assert not harness.expire_silent(3 * H)
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0, agent.log()
    assert "Traceback" not in agent.log()


def test_a_worker_whose_leases_stop_is_still_lost_and_told_so(counted: tuple[AgentHarness, CountingApp]) -> None:
    harness, _app = counted
    agent = harness.start_agent(instance_id="i-frozen", extra=IDLE)
    worker = harness.worker_of("i-frozen")
    wait_for("the agent's long-poll", lambda: len(harness.ctx.lease_waiters) == 1, timeout=30)
    agent.signal(signal.SIGSTOP)  # a partition: neither heartbeat nor lease arrives
    try:
        lost = wait_for("the worker to be expired", lambda: harness.expire_silent(3 * H), timeout=30, every=0.2)
        assert lost == [worker["id"]]
        assert _heartbeat_age_s(harness, worker["id"]) >= 3 * H
    finally:
        agent.signal(signal.SIGCONT)
    # Back, its next lease carries its heartbeat, whose reply says the worker is gone.
    assert agent.wait(timeout=30) == 2, agent.log()
    assert "declared this worker gone" in agent.log()


def test_a_drain_reaches_an_agent_that_only_long_polls(counted: tuple[AgentHarness, CountingApp]) -> None:
    harness, app = counted
    agent = harness.start_agent(instance_id="i-drained", extra=IDLE)
    worker = harness.worker_of("i-drained")
    wait_for("the agent's long-poll", lambda: len(harness.ctx.lease_waiters) == 1, timeout=30)
    r = harness.admin.post(f"/api/v1/workers/{worker['id']}/drain", json={})
    assert r.status_code == 200, r.text
    # Idle and drained: it deregisters and exits 0, told by a lease's heartbeat reply.
    assert agent.wait(timeout=30) == 0, agent.log()
    assert "drain requested by the server" in agent.log()
    assert app.snapshot()["heartbeat"] == 0 and app.snapshot()["deregister"] == 1


def test_an_agent_running_a_task_heartbeats_on_its_own(counted: tuple[AgentHarness, CountingApp]) -> None:
    harness, app = counted
    # Output is sent every 30 s here, so all of it is the last and must go with the finish.
    agent = harness.start_agent(instance_id="i-busy", extra=[*IDLE, "--log-flush", "30"])
    harness.worker_of("i-busy")
    task = harness.enqueue(py("import time; time.sleep(4); print('last words')"))
    harness.wait_state(task, "running", timeout=30)
    before = app.snapshot()
    time.sleep(3 * H)
    during = app.snapshot() - before
    assert during["heartbeat"] >= 2, during  # the running task is reported by heartbeats
    assert harness.wait_state(task, "succeeded", "failed", timeout=30)["state"] == "succeeded"
    # Its last output came with its finish: no upload of its own.
    assert "last words" in harness.logs(task)
    calls = app.snapshot()
    assert (calls["start"], calls["finish"], calls["logs"]) == (1, 1, 0), calls
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0, agent.log()
