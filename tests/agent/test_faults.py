"""Spot notices, machine loss, a server outage: the task history says why each
attempt ended, and no task is lost."""

from __future__ import annotations

import os
import re
import signal
import time

from tests.agent.conftest import BOTH_BACKENDS, AgentHarness, py, wait_for
from tests.fakes.metadata import FakeMetadata

CHECKPOINTING_TASK = (
    "import os, signal, sys, time\n"
    "attempt = os.environ['AUTOSCALER_TASK_ATTEMPT']\n"
    "def stop(*_):\n    print('checkpoint at attempt', attempt, flush=True); sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\n"
    "print('attempt', attempt, 'on', os.environ['CUDA_VISIBLE_DEVICES'], flush=True)\n"
    "if attempt == '1': time.sleep(60)\n"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_spot_notices_on_aws_gcp_and_azure_interrupt_requeue_and_another_agent_completes(
    harness: AgentHarness,
) -> None:
    # One spot agent per cloud, each watching its own fake metadata service; the three
    # run side by side so the test costs one lifecycle, not three.
    clouds = {p: FakeMetadata(p, instance_id=f"{p}-vm-1").start() for p in ("aws", "gcp", "azure")}
    try:
        tasks = [harness.enqueue(py(CHECKPOINTING_TASK)) for _ in clouds]
        # No --instance-id: each agent asks its (fake) metadata service, as on a real VM.
        agents = {
            p: harness.start_agent(instance_id="", extra=["--provider", p, "--metadata-url", fake.url])
            for p, fake in clouds.items()
        }
        for t in tasks:
            harness.wait_state(t, "running")
        workers = {p: harness.worker_of(f"{p}-vm-1") for p in clouds}
        for p, fake in clouds.items():
            wait_for(f"{p} notice polls", lambda fake=fake: fake.polls() >= 2)  # type: ignore[misc]
            fake.arm()

        for p, agent in agents.items():
            assert agent.wait() == 0, agent.log()
            assert "preemption notice" in agent.log()
            # The grace comes from the notice: AWS's two minutes and Azure's NotBefore
            # (the fake's defaults: 120 s and 30 s), GCP's 30 s from when the flag was seen.
            assert re.search(r"SIGKILL after \d+s: deadline in \d+s, \d+s kept to report", agent.log()), agent.log()
            # What the reconciler reads to mark the instance preempted, not merely drained.
            row = harness.worker_row(workers[p]["id"])
            assert (row.state, row.drain_reason, row.gone_reason) == ("gone", "spot", "deregistered")
        for t in tasks:
            task = harness.task(t)
            assert task["state"] == "queued", task
            assert [e["reason"] for e in task["events"]][-2:] == [
                "interrupted:spot",
                "requeued after interrupted:spot",
            ]

        harness.start_agent(gpus=3, instance_id="i-replacement")
        for t in tasks:
            done = harness.wait_state(t, "succeeded")
            assert done["attempts"] == 2
            out = harness.logs(t)
            assert "checkpoint at attempt 1" in out and "attempt 2 on " in out
    finally:
        for fake in clouds.values():
            fake.stop()


def test_a_task_that_ignores_sigterm_on_a_spot_notice_is_killed_at_the_notice_deadline_less_the_margin(
    harness: AgentHarness,
) -> None:
    metadata = FakeMetadata("aws", instance_id="i-spot").start()
    try:
        task = harness.enqueue(
            py("import signal, time\nsignal.signal(signal.SIGTERM, lambda *_: None)\ntime.sleep(60)")
        )
        agent = harness.start_agent(
            instance_id="",
            extra=["--provider", "aws", "--metadata-url", metadata.url, "--preempt-margin", "1"],
        )
        harness.wait_state(task, "running")
        worker = harness.worker_of("i-spot")
        armed = time.monotonic()
        metadata.arm(notice_s=5)  # AWS's instance-action time, 5 s ahead (4-5 s by the second)
        # While the task still holds on, the server already counts the worker out.
        w = wait_for("worker draining", lambda: (x := harness.worker(worker["id"]))["state"] == "draining" and x)
        assert w["drain_deadline"] is not None
        assert agent.wait() == 0
        # Not --preempt-grace (1 s): the notice's own deadline (4-5 s after arming) minus
        # --preempt-margin (1 s). Measured from arming, so a slow machine only adds to it.
        assert time.monotonic() - armed >= 3.0
        assert re.search(r"SIGKILL after [2-4]s: deadline in [3-5]s, 1s kept to report", agent.log()), agent.log()
        t = harness.task(task)
        assert t["state"] == "queued" and t["events"][-2]["reason"] == "interrupted:spot"
        assert t["exit_code"] == -9  # it would not checkpoint, so it was killed
    finally:
        metadata.stop()


@BOTH_BACKENDS
def test_agent_killed_mid_task_is_noticed_and_the_task_completes_elsewhere(harness: AgentHarness) -> None:
    task = harness.enqueue(
        py(
            "import os, time\n"
            "print('attempt', os.environ['AUTOSCALER_TASK_ATTEMPT'], 'pid', os.getpid(), flush=True)\n"
            "if os.environ['AUTOSCALER_TASK_ATTEMPT'] == '1': time.sleep(60)"
        )
    )
    doomed = harness.start_agent(instance_id="i-doomed")
    harness.wait_state(task, "running")
    worker = harness.worker_of("i-doomed")
    pid = int(wait_for("the task's pid", lambda: re.findall(r"pid (\d+)", harness.logs(task)))[0])
    doomed.proc.kill()  # kill -9: no drain, no goodbye
    doomed.proc.wait(5)
    # The orphaned task must not keep the GPU busy while its task runs elsewhere.
    wait_for("the orphaned task to die", lambda: not _alive(pid), timeout=5)

    # What the server's housekeeping does every few seconds, with a 1 s timeout.
    wait_for("the worker to be expired", lambda: harness.expire_silent(1.0), timeout=10, every=0.2)
    t = harness.task(task)
    assert t["state"] == "queued"
    assert [e["reason"] for e in t["events"]][-2:] == ["lost:heartbeat", "requeued after lost:heartbeat"]
    assert harness.worker(worker["id"])["gone_reason"] == "heartbeat"

    harness.start_agent(instance_id="i-survivor")
    done = harness.wait_state(task, "succeeded")
    assert done["attempts"] == 2 and "attempt 2" in harness.logs(task)


def test_server_outage_and_restart_do_not_disturb_running_tasks(harness: AgentHarness) -> None:
    task = harness.enqueue(py("import time\nprint('before', flush=True)\ntime.sleep(1.2)\nprint('after')"))
    agent = harness.start_agent(instance_id="i-patient")
    harness.wait_state(task, "running")
    wait_for("first output", lambda: "before" in harness.logs(task))
    restarted = harness.restart_server()  # stopped now; started again below
    wait_for("the agent to notice", lambda: "server unreachable" in agent.log(), timeout=10)
    time.sleep(1.5)  # the task ends while the server is away: its report must wait
    restarted.start()
    try:
        done = harness.wait_state(task, "succeeded")
        assert done["attempts"] == 1
        assert "after" in harness.logs(task)
        wait_for("the agent to say so", lambda: "server reachable again" in agent.log())
        assert agent.proc.poll() is None
        agent.signal(signal.SIGTERM)
        assert agent.wait() == 0
    finally:
        restarted.stop()


def test_a_worker_the_server_gave_up_on_stops_its_tasks_and_exits_2(harness: AgentHarness) -> None:
    # A partition longer than the heartbeat timeout: the server requeued the task, so the
    # agent must not run it on (the zombie worker of the closest peer).
    task = harness.enqueue(py("import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(60)"))
    agent = harness.start_agent(instance_id="i-partitioned")
    harness.wait_state(task, "running")
    pid = int(wait_for("the task's pid", lambda: re.findall(r"pid (\d+)", harness.logs(task)))[0])
    agent.signal(signal.SIGSTOP)
    try:
        wait_for("the worker to be expired", lambda: harness.expire_silent(0.5), timeout=10, every=0.2)
    finally:
        agent.signal(signal.SIGCONT)
    assert agent.wait() == 2
    assert "declared this worker gone" in agent.log()
    assert not _alive(pid)
    t = harness.task(task)
    assert t["state"] == "queued" and t["events"][-2]["reason"] == "lost:heartbeat"


def test_sigterm_while_the_server_is_away_ends_the_agent_within_its_drain_deadline(harness: AgentHarness) -> None:
    # Production-sized back-off (30 s) and flush window (60 s): before the fix the agent
    # skipped its exit check while a heartbeat retry was pending, and every failed
    # heartbeat pushed the retry later, so it never left.
    agent = harness.start_agent(
        instance_id="i-stranded", extra=["--drain-deadline", "3", "--kill-grace", "1", "--backoff-max", "30"]
    )
    harness.worker_of("i-stranded")
    restarted = harness.restart_server()  # stopped; never started again
    wait_for("the agent to notice", lambda: "server unreachable" in agent.log(), timeout=10)
    time.sleep(2)  # a few failed heartbeats: the next retry is well in the future
    sent = time.monotonic()
    agent.signal(signal.SIGTERM)
    code = agent.wait(timeout=3 + 1 + 5)  # drain deadline + kill grace + a start-up margin
    took = time.monotonic() - sent
    assert code == 0, agent.log()
    assert took <= 3 + 1 + 2.5, f"{took:.1f}s\n{agent.log()}"
    assert "could not deregister" in agent.log()
    del restarted


def test_a_second_sigterm_while_the_server_is_away_ends_the_agent_at_once(harness: AgentHarness) -> None:
    task = harness.enqueue(py("import time\nprint('busy', flush=True)\ntime.sleep(60)"))
    agent = harness.start_agent(instance_id="i-hurried", extra=["--drain-deadline", "60", "--backoff-max", "30"])
    harness.wait_state(task, "running")
    harness.restart_server()
    wait_for("the agent to notice", lambda: "server unreachable" in agent.log(), timeout=10)
    agent.signal(signal.SIGTERM)
    wait_for("the drain", lambda: "SIGTERM: draining" in agent.log())
    sent = time.monotonic()
    agent.signal(signal.SIGTERM)  # the task is interrupted now (kill grace 1 s) and the agent leaves
    assert agent.wait(timeout=10) == 0, agent.log()
    assert time.monotonic() - sent <= 1 + 3, agent.log()
    assert "second signal" in agent.log()
