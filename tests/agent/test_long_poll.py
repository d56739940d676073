"""A real agent process long-polls its lease while idle (`--lease-wait`).

The agent is set up so that only the long-poll can bring it work in time: its lease
interval (the poll it falls back to) and its heartbeat are far longer than the test
waits. It is left idle until its lease is parked in the server, then a task is
enqueued: the enqueue must release that lease and the task must run.
"""

from __future__ import annotations

import signal

from tests.agent.conftest import AgentHarness, py, wait_for

SLOW = ["--heartbeat-interval", "40", "--lease-interval", "120", "--lease-wait", "30"]


def test_an_idle_agent_waiting_in_a_long_poll_is_given_work_the_moment_it_is_enqueued(
    harness: AgentHarness,
) -> None:
    agent = harness.start_agent(instance_id="i-longpoll", extra=SLOW)
    waiters = harness.server.ctx.lease_waiters
    harness.worker_of("i-longpoll")
    wait_for("the agent's lease to wait in the server", lambda: len(waiters) == 1, timeout=30)
    task = harness.enqueue(py("print('woken')"))
    # Without the long-poll the agent's next lease would be 120 s away.
    assert harness.wait_state(task, "succeeded", "failed", timeout=30)["state"] == "succeeded"
    assert "woken" in harness.logs(task)
    waiters.close()  # what a stopping server does: no lease waits any more
    agent.signal(signal.SIGTERM)
    assert agent.wait(timeout=30) == 0
    assert "Traceback" not in agent.log()
