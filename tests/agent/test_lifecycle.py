"""Real agent processes against the real server: register, run, report, drain."""

from __future__ import annotations

import signal

from tests.agent.conftest import BOTH_BACKENDS, AgentHarness, py, wait_for


@BOTH_BACKENDS
def test_agent_registers_inventory_runs_tasks_and_streams_output(harness: AgentHarness) -> None:
    ok = harness.enqueue(
        py(
            "import os, sys; print('hello from', os.environ['AUTOSCALER_TASK_ID']); "
            "print('gpus', os.environ['CUDA_VISIBLE_DEVICES']); "
            "print('token leaked' if 'AUTOSCALER_JOIN_TOKEN' in os.environ else 'no token', flush=True); "
            "print('oops', file=sys.stderr)"
        )
    )
    bad = harness.enqueue(py("import sys; sys.exit(3)"), gpus=0, max_attempts=1)
    agent = harness.start_agent(gpus=2, instance_id="i-basic")

    done = harness.wait_state(ok, "succeeded")
    failed = harness.wait_state(bad, "failed")
    assert done["exit_code"] == 0 and done["attempts"] == 1
    assert failed["exit_code"] == 3 and failed["end_reason"] == "exit_code" and failed["failures"] == 1
    out = harness.logs(ok, "stdout")
    assert out == f"hello from {ok}\ngpus 0\nno token\n"
    assert harness.logs(ok, "stderr") == "oops\n"  # the join token is the agent's secret, never the task's

    worker = harness.worker_of("i-basic")
    assert worker["gpu_count"] == 2 and worker["simulated_gpus"] is False
    first = worker["gpus"][0]
    assert first["model"] == "NVIDIA A10G" and first["uuid"] == "GPU-00000000-fake"
    assert first["driver_version"] == "550.54.15" and first["cuda_version"] == "12.4"
    metrics = wait_for("GPU metrics", lambda: harness.worker(worker["id"])["gpu_metrics"])
    assert [m["utilization_pct"] for m in metrics] == [0, 10]
    agent.signal(signal.SIGTERM)
    assert agent.wait() == 0
    assert harness.worker(worker["id"])["state"] == "gone"


def test_drain_lets_the_busy_task_finish_takes_no_new_one_and_exits_0(harness: AgentHarness) -> None:
    marker = harness.tmp / "release"
    long = harness.enqueue(
        py(f"import os, time\nwhile not os.path.exists({str(marker)!r}): time.sleep(0.05)\nprint('finished')")
    )
    agent = harness.start_agent(gpus=1, instance_id="i-drain")
    harness.wait_state(long, "running")
    waiting = harness.enqueue(py("print('should not run here')"), gpus=0)
    worker = harness.worker_of("i-drain")
    r = harness.admin.post(f"/api/v1/workers/{worker['id']}/drain", json={"deadline_s": 60, "reason": "scale-down"})
    assert r.status_code == 200, r.text
    wait_for("the agent to see the drain", lambda: "drain requested by the server" in agent.log())
    marker.write_text("go")

    assert agent.wait() == 0
    assert harness.task(long)["state"] == "succeeded"
    assert harness.task(waiting)["state"] == "queued"  # drained workers lease nothing
    gone = harness.worker(worker["id"])
    assert gone["state"] == "gone" and gone["gone_reason"] == "deregistered"


def test_drain_deadline_interrupts_and_requeues_the_task(harness: AgentHarness) -> None:
    task = harness.enqueue(
        py(
            "import signal, sys, time\n"
            "def stop(*_):\n    print('checkpointing', flush=True); sys.exit(0)\n"
            "signal.signal(signal.SIGTERM, stop)\nprint('working', flush=True)\ntime.sleep(60)"
        )
    )
    agent = harness.start_agent(gpus=1, instance_id="i-deadline", extra=["--drain-deadline", "30"])
    harness.wait_state(task, "running")
    wait_for("output", lambda: "working" in harness.logs(task))
    agent.signal(signal.SIGTERM)  # = drain: the task may run on for 30 s
    wait_for("the drain", lambda: "SIGTERM: draining" in agent.log())
    assert harness.task(task)["state"] == "running"
    agent.signal(signal.SIGTERM)  # a second one: the deadline is now

    assert agent.wait(timeout=10) == 0
    t = harness.task(task)
    # Exit 0 after SIGTERM is a checkpoint, not a success: requeued at the head of the queue.
    assert t["state"] == "queued" and t["attempts"] == 1
    reasons = [e["reason"] for e in t["events"]]
    assert reasons[-2:] == ["interrupted:drain", "requeued after interrupted:drain"]
    assert "checkpointing" in harness.logs(task)
