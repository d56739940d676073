"""A restarted agent re-registers with its worker token: the join token registers once.

Real agent processes against the live server. The agent keeps its worker id and token
in its state dir (worker.json, 0600 in a 0700 directory); a restart after a crash, or after the
server declared the worker gone (exit 2), presents that token instead of the spent
join token (removed from the bootstrap file after joining); a drained agent
removes the file.
"""

from __future__ import annotations

import json
import signal
import stat

from tests.agent.conftest import BOTH_BACKENDS, AgentHarness, py, wait_for


def live_workers(harness: AgentHarness, instance_id: str) -> list[dict[str, object]]:
    return [w for w in harness.workers() if w["instance_id"] == instance_id and w["state"] != "gone"]


@BOTH_BACKENDS
def test_a_restarted_agent_reregisters_with_its_worker_token(harness: AgentHarness) -> None:
    state = harness.tmp / "agent-state" / "worker.json"
    token = harness.join_token()
    flags = ["--state-dir", str(state.parent)]
    first = harness.start_agent(instance_id="i-restart", token=token, extra=flags)
    w1 = harness.worker_of("i-restart")
    saved = wait_for("the state file", lambda: state.exists() and json.loads(state.read_text()))
    assert saved["worker_id"] == w1["id"] and saved["worker_token"].startswith("asw_")
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.parent.stat().st_mode) == 0o700

    # The agent crashes; its service manager starts it again with the same bootstrap
    # (the join token is spent by now).
    first.proc.kill()
    first.wait()
    second = harness.start_agent(instance_id="i-restart", token=token, extra=flags)
    wait_for("re-registration", lambda: "re-registered with the saved worker token" in second.log())
    live = wait_for("one live worker", lambda: [w for w in live_workers(harness, "i-restart") if w["id"] != w1["id"]])
    assert len(live) == 1 and len(live_workers(harness, "i-restart")) == 1
    old = harness.worker(w1["id"])
    assert old["state"] == "gone" and old["gone_reason"] == "re-registered"
    assert json.loads(state.read_text())["worker_id"] == live[0]["id"]
    # ... and it works: it runs a task.
    task = harness.enqueue(py("print('after restart')"), gpus=0)
    assert harness.wait_state(task, "succeeded")["state"] == "succeeded"

    # Someone else holding the spent join token (no saved worker token) is refused.
    thief = harness.start_agent(
        instance_id="i-restart", token=token, extra=["--state-dir", str(harness.tmp / "thief-state")]
    )
    assert thief.wait() == 1
    assert "already used" in thief.log()
    with harness.ctx.sessions() as s:
        from sqlalchemy import select

        from autoscaler.state.models import SecurityEvent

        kinds = [e.kind for e in s.scalars(select(SecurityEvent))]
    assert kinds == ["join_replay"]

    # A drained agent deregisters and forgets its worker token.
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    assert not state.exists()


def test_an_agent_declared_gone_comes_back_with_its_worker_token(harness: AgentHarness) -> None:
    state = harness.tmp / "gone-state" / "worker.json"
    token = harness.join_token()
    flags = ["--state-dir", str(state.parent)]
    agent = harness.start_agent(instance_id="i-gone", token=token, extra=flags)
    w1 = harness.worker_of("i-gone")
    wait_for("the state file", state.exists)
    agent.signal(signal.SIGSTOP)  # a partition: no heartbeats
    try:
        wait_for("the worker to be expired", lambda: w1["id"] in harness.expire_silent(0.5), timeout=10, every=0.3)
    finally:
        agent.signal(signal.SIGCONT)
    assert agent.wait() == 2  # told it is gone; the state file stays for the restart
    assert state.exists()
    again = harness.start_agent(instance_id="i-gone", token=token, extra=flags)
    wait_for("re-registration", lambda: "re-registered with the saved worker token" in again.log())
    live = wait_for("a live worker", lambda: live_workers(harness, "i-gone"))
    assert live[0]["id"] != w1["id"]
    again.signal(signal.SIGTERM)
    assert again.wait() == 0
