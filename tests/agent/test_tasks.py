"""How the agent runs tasks: GPU pinning, cancel, timeout, start failures, tokens."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from autoscaler.config import parse_config
from tests.agent.conftest import BOTH_BACKENDS, AgentHarness, py, wait_for
from tests.conftest import TEST_CONFIG


@BOTH_BACKENDS
def test_four_gpu_worker_runs_four_one_gpu_tasks_at_once_on_different_gpus(harness: AgentHarness) -> None:
    rendezvous = harness.tmp / "rendezvous"
    rendezvous.mkdir()
    # Each task announces its GPU, then waits until all four are there: they can only
    # all succeed if they run at the same time.
    code = (
        "import os, pathlib, time\n"
        f"d = pathlib.Path({str(rendezvous)!r})\n"
        "(d / os.environ['AUTOSCALER_TASK_ID']).write_text(os.environ['CUDA_VISIBLE_DEVICES'])\n"
        "deadline = time.time() + 10\n"
        "while len(list(d.iterdir())) < 4 and time.time() < deadline: time.sleep(0.02)\n"
        "raise SystemExit(0 if len(list(d.iterdir())) == 4 else 7)\n"
    )
    tasks = [harness.enqueue(py(code)) for _ in range(4)]
    fifth = harness.enqueue(py("print('later')"))
    harness.start_agent(gpus=4, instance_id="i-four")
    for t in tasks:
        assert harness.wait_state(t, "succeeded", "failed")["state"] == "succeeded"
    seen = sorted(p.read_text() for p in rendezvous.iterdir())
    assert seen == ["0", "1", "2", "3"]
    indices = sorted(harness.task(t)["gpu_indices"][0] for t in tasks)
    assert indices == [0, 1, 2, 3]
    assert harness.wait_state(fifth, "succeeded")["attempts"] == 1


def test_a_join_token_cannot_register_a_second_instance(harness: AgentHarness) -> None:
    token = harness.join_token()
    first = harness.start_agent(instance_id="i-first", token=token)
    harness.worker_of("i-first")
    second = harness.start_agent(instance_id="i-second", token=token)
    assert second.wait() == 1
    log = second.log()
    assert "refused registration" in log and "join token was already used" in log
    assert "Traceback" not in log
    first.signal(signal.SIGTERM)
    assert first.wait() == 0


def test_an_unknown_join_token_is_refused_saying_how_to_make_one(harness: AgentHarness) -> None:
    # The server's 401 told the agent's operator to check AUTOSCALER_TOKEN (the CLI's variable).
    agent = harness.start_agent(instance_id="i-bogus", token="asj_not-a-token")
    assert agent.wait() == 1
    log = agent.log()
    assert "refused registration: the join token is invalid or expired" in log, log
    assert "`autoscaler token create --join --pool POOL`" in log and "AUTOSCALER_TOKEN" not in log
    assert "Traceback" not in log


def test_cancel_sends_sigterm_then_sigkill_after_the_grace(harness: AgentHarness) -> None:
    stubborn = harness.enqueue(
        py(
            "import signal, time\n"
            "signal.signal(signal.SIGTERM, lambda *_: print('ignoring TERM', flush=True))\n"
            "print('up', flush=True)\ntime.sleep(60)"
        )
    )
    harness.start_agent(instance_id="i-cancel")
    wait_for("the task to print", lambda: "up" in harness.logs(stubborn))
    r = harness.admin.post(f"/api/v1/tasks/{stubborn}/cancel")
    assert r.status_code == 200, r.text
    t = harness.wait_state(stubborn, "canceled")
    assert t["end_reason"] == "canceled" and t["exit_code"] == -9  # SIGKILL after --kill-grace 1
    assert "ignoring TERM" in harness.logs(stubborn)
    assert "killed by SIGKILL" in t["events"][-1]["detail"]


def test_timeout_start_failures_and_exit_codes_are_told_apart(harness: AgentHarness) -> None:
    slow = harness.enqueue(py("import time; time.sleep(30)"), timeout_s=0.5, max_attempts=1)
    # A program that cannot start is not retried, whatever max_attempts allows.
    missing = harness.enqueue(["/nonexistent/program"], gpus=0, max_attempts=3)
    nowhere = harness.enqueue(py("print(1)"), gpus=0, working_dir="/nonexistent-dir", max_attempts=3)
    harness.start_agent(instance_id="i-mixed", extra=["--max-tasks", "3"])
    t = harness.wait_state(slow, "failed")
    assert t["end_reason"] == "timeout" and t["exit_code"] == -15 and t["failures"] == 1
    m = harness.wait_state(missing, "failed")
    assert m["end_reason"] == "start_failed" and "No such file" in m["events"][-1]["detail"]
    n = harness.wait_state(nowhere, "failed")
    assert n["end_reason"] == "start_failed" and "/nonexistent-dir does not exist" in n["events"][-1]["detail"]
    assert (m["attempts"], m["failures"], n["attempts"], n["failures"]) == (1, 1, 1, 1)


def test_a_command_that_fails_once_is_retried_and_succeeds(harness: AgentHarness) -> None:
    # The first attempt leaves a marker and exits 1; the second finds it and exits 0.
    marker = harness.tmp / "ran-once"
    flaky = harness.enqueue(
        py(
            "import pathlib, sys\n"
            f"p = pathlib.Path({str(marker)!r})\n"
            "if p.exists(): print('second try', flush=True); sys.exit(0)\n"
            "p.write_text('x'); print('first try', flush=True); sys.exit(1)\n"
        ),
        gpus=0,
        max_attempts=2,
    )
    # Killed by SIGKILL the first time (the agent reports -9): retried, as 137 is listed.
    oom_marker = harness.tmp / "killed-once"
    killed = harness.enqueue(
        py(
            "import os, pathlib, signal\n"
            f"p = pathlib.Path({str(oom_marker)!r})\n"
            "if not p.exists(): p.write_text('x'); os.kill(os.getpid(), signal.SIGKILL)\n"
        ),
        gpus=0,
        max_attempts=2,
        retry_on_exit_codes=[137],
    )
    harness.start_agent(instance_id="i-retry", extra=["--max-tasks", "2"])
    done = harness.wait_state(flaky, "succeeded", "failed")
    assert (done["state"], done["failures"], done["interruptions"], done["attempts"]) == ("succeeded", 1, 0, 2)
    ends = [(e["attempt"], e["to_state"], e["reason"]) for e in done["events"] if e["reason"].startswith("exit")]
    assert ends == [(1, "queued", "exit 1"), (2, "succeeded", "exit 0")]
    assert harness.logs(flaky, "stdout") == "first try\nsecond try\n"
    k = harness.wait_state(killed, "succeeded", "failed")
    assert (k["state"], k["failures"], k["attempts"]) == ("succeeded", 1, 2)
    assert [e["reason"] for e in k["events"] if e["reason"].startswith("exit")] == ["exit -9", "exit 0"]


def test_lost_gpu_is_reported_in_metrics_and_the_agent_keeps_going(harness: AgentHarness) -> None:
    from tests.fakes import nvml

    script = {"gpus": nvml.gpus(2)}
    agent = harness.start_agent(instance_id="i-lost-gpu", nvml_script=script)
    worker = harness.worker_of("i-lost-gpu")
    script["gpus"][1]["error"] = "GpuIsLost"
    agent.nvml_script.write_text(json.dumps(script))

    def lost() -> list[dict[str, object]] | None:
        metrics = harness.worker(worker["id"])["gpu_metrics"]
        return metrics if len(metrics) == 2 and metrics[1].get("error") else None

    metrics = wait_for("the lost GPU in the metrics", lost)
    assert metrics[1]["error"] == "GPU is lost" and metrics[0]["error"] is None
    task = harness.enqueue(py("print('still working')"))
    assert harness.wait_state(task, "succeeded")
    assert agent.proc.poll() is None


def test_bootstrap_file_with_simulated_gpus_on_a_machine_without_nvml(harness: AgentHarness) -> None:
    boot = harness.tmp / "agent.json"
    boot.write_text(
        json.dumps(
            {
                "server_url": harness.server.url,
                "pool": "gpu-pool",
                "provider": "local",
                "join_token": harness.join_token(),
                "instance_id": "local-1",
                "labels": {"zone": "desk"},
                "simulated_gpus": {"count": 2, "model": "Simulated A10G", "memory_mb": 1024},
                "metadata_url": None,
                "future_field": 1,
            }
        )
    )
    boot.chmod(0o600)
    # The test config's gpu-pool declares 1-GPU machines, and enqueue refuses what no
    # declared shape fits: declare the 2-GPU machine this agent is.
    harness.ctx.config = parse_config(
        TEST_CONFIG.replace("gpus: 1, gpu_type: A10G", "gpus: 2, gpu_type: A10G"), Path("test.yaml")
    )
    task = harness.enqueue(py("import os; print('on', os.environ['CUDA_VISIBLE_DEVICES'])"), gpus=2)
    agent = harness.start_agent(
        instance_id=None,
        token="",
        nvml_script={"init_error": "DriverNotLoaded"},
        extra=["--bootstrap", str(boot)],
        use_flags=False,
    )
    assert harness.wait_state(task, "succeeded")
    assert "on 0,1" in harness.logs(task)
    w = harness.worker_of("local-1")
    assert w["simulated_gpus"] is True and w["gpu_count"] == 2 and w["provider"] == "local"
    assert all(g["simulated"] and g["model"] == "Simulated A10G" for g in w["gpus"])
    assert "ignoring unknown key 'future_field'" in agent.log()
