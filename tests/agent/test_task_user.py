"""What a task can steal on its machine: a real agent, started from cloud-init user-data
by the local provider against the live server, runs two co-located tasks; the second
one tries to read the bootstrap file, the worker token file, the agent's environment,
the first task's environment and its scratch dir, and prints what it got. As root the
agent runs tasks as the unprivileged user (or a uid per task from run_as_range) and
refuses root tasks unless allowed.

These need root (switching users); the test process is root in CI and here.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoscaler.agent.settings import agent_env_names
from providers.base import LaunchRequest
from providers.bootstrap import BootstrapSpec, render_user_data
from providers.local import LocalProvider, LocalRecord, default_offering
from tests.agent.conftest import FAST, AgentHarness, py, wait_for
from tests.conftest import REPO

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="tasks under another uid need an agent running as root (run the tests as root)"
)
SH = "/bin/sh"
POOL = "gpu-pool"
SIM = {"count": 2, "model": "Simulated A10G", "memory_mb": 24576}
SECRET = "victim-secret-3f9a1c"
RANGE = (64100, 64115)


def _agent_env() -> dict[str, str]:
    """The environment a control plane would give its local agents: nothing that
    configures the agent (the suite's root-task default included)."""
    env = {k: v for k, v in os.environ.items() if k not in agent_env_names()}
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def local_agent(harness: AgentHarness, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    """A local instance launched from rendered user-data; yields its paths and pid."""
    run_as_range = request.param
    token = harness.join_token(POOL)
    spec = BootstrapSpec(server_url=harness.server.url, pool=POOL, provider="local", join_token=token)
    local = LocalProvider(
        [],
        pool=POOL,
        home=tmp_path / "home",
        simulated_gpus=SIM,
        command=lambda boot: [sys.executable, "-m", "autoscaler", "agent", "--bootstrap", str(boot), *FAST],
        env=_agent_env(),
        stop_grace_s=5,
        run_as_range=run_as_range,
    )
    request_ = LaunchRequest(
        request_id=f"req-taskuser-{run_as_range}",
        pool=POOL,
        owner="test",
        offering=default_offering(SIM),
        user_data=render_user_data(spec),
    )
    (inst,) = local.launch(request_)
    d = local.instance_dir(inst.instance_id)
    try:
        worker = harness.worker_of(inst.instance_id)
        # The agent drops the join token right after the server answered its registration.
        wait_for("the agent to drop its join token", lambda: "removed the join token" in (d / "agent.log").read_text())
        yield {
            "dir": d,
            "bootstrap": d / "agent.json",
            "worker_file": d / "state" / "worker.json",
            "join_token": token,
            "worker": worker,
            "agent_pid": LocalRecord.load(d / "instance.json").pid,
            "log": d / "agent.log",
            "range": run_as_range,
        }
    finally:
        local.terminate([inst.instance_id])


def _logs(harness: AgentHarness, task_id: str) -> str:
    return harness.logs(task_id)


THIEF = r"""
try() { echo "== $1"; cat "$1" 2>&1 | tr '\0' '\n'; }
echo "uid $(id -u) gid $(id -g)"
try "$BOOT"
try "$WORKER"
try "/proc/$AGENT/environ"
try "/proc/$VICTIM/environ"
echo "== ls victim scratch"; ls -la "$VSCRATCH" 2>&1
echo "== own env"; env | grep -e AUTOSCALER_JOIN -e AUTOSCALER_TOKEN -e asj_ -e asw_ || echo "(none)"
echo "== kill victim"; kill -0 "$VICTIM" 2>&1 && echo "can signal" || echo "cannot signal"
"""


@pytest.mark.parametrize(
    "local_agent", [f"{RANGE[0]}-{RANGE[1]}", None], indirect=True, ids=["uid-per-task", "shared-uid"]
)
def test_a_task_cannot_read_the_tokens_or_another_tasks_environment(
    harness: AgentHarness, local_agent: dict[str, Any]
) -> None:
    a = local_agent
    # After registration the bootstrap file keeps everything but the join token.
    boot = json.loads(a["bootstrap"].read_text())
    assert "join_token" not in boot and a["join_token"] not in a["bootstrap"].read_text()
    assert boot["server_url"] == harness.server.url and boot["pool"] == POOL
    assert stat.S_IMODE(a["bootstrap"].stat().st_mode) == 0o600
    # The worker token lives in the agent's state dir, readable by the agent's user only.
    saved = json.loads(a["worker_file"].read_text())
    worker_token = saved["worker_token"]
    assert saved["worker_id"] == a["worker"]["id"] and worker_token.startswith("asw_")
    assert stat.S_IMODE(a["worker_file"].stat().st_mode) == 0o600
    assert stat.S_IMODE(a["worker_file"].parent.stat().st_mode) == 0o700

    victim = harness.enqueue(
        [SH, "-c", 'echo "victim pid $$ uid $(id -u) cwd $(pwd)"; sleep 60'], env={"VICTIM_SECRET": SECRET}
    )
    harness.wait_state(victim, "running")
    line = wait_for("the victim's pid", lambda: "victim pid" in _logs(harness, victim) and _logs(harness, victim))
    words = line.split("victim pid", 1)[1].split()
    vpid, vuid, vcwd = words[0], int(words[2]), words[4]
    thief = harness.enqueue(
        [SH, "-c", THIEF],
        env={
            "BOOT": str(a["bootstrap"]),
            "WORKER": str(a["worker_file"]),
            "AGENT": str(a["agent_pid"]),
            "VICTIM": vpid,
            "VSCRATCH": vcwd,
        },
    )
    done = harness.wait_state(thief, "succeeded", "failed", timeout=30)
    out = _logs(harness, thief)
    assert done["state"] == "succeeded", out
    tuid = int(out.split("uid ", 1)[1].split()[0])
    task_user = pwd.getpwnam("autoscaler-task")

    # Nothing secret reached the thief: not the join token, not the worker token.
    assert a["join_token"] not in out and worker_token not in out, out
    section = {s.split("\n", 1)[0]: s for s in out.split("== ")[1:]}
    for path in (a["bootstrap"], a["worker_file"], f"/proc/{a['agent_pid']}/environ"):
        assert "Permission denied" in section[str(path)], out
    assert "(none)" in section["own env"], out
    assert tuid != 0 and vuid != 0
    if a["range"] is not None:
        # A uid per task: the other task's environment, scratch dir and process are out of reach.
        assert RANGE[0] <= tuid <= RANGE[1] and RANGE[0] <= vuid <= RANGE[1] and tuid != vuid, out
        assert SECRET not in out, out
        assert "Permission denied" in section[f"/proc/{vpid}/environ"], out
        assert "Permission denied" in section["ls victim scratch"], out
        assert "cannot signal" in section["kill victim"], out
    else:
        # One shared task uid: tokens stay out of reach, but co-located tasks can read
        # each other's environment (documented; run_as_range or tenancy: team fix it).
        assert tuid == vuid == task_user.pw_uid, out
        assert SECRET in section[f"/proc/{vpid}/environ"], out
    # The victim's scratch dir is private and its own.
    st = Path(vcwd).stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (vuid, 0o700)
    harness.admin.post(f"/api/v1/tasks/{victim}/cancel")
    harness.wait_state(victim, "canceled", "failed", "succeeded", timeout=20)
    assert "tasks run as" in a["log"].read_text()


def test_root_tasks_are_refused_unless_allowed(harness: AgentHarness) -> None:
    agent = harness.start_agent(root_tasks=False, extra=["--run-as", "root"])
    task = harness.enqueue(py("print('ran')"))
    done = harness.wait_state(task, "failed", "succeeded", timeout=20)
    assert done["state"] == "failed", done
    text = json.dumps(done)
    assert "refusing to run tasks as root" in text and "allow_root_tasks" in text, text
    assert "refusing to run tasks as root" in agent.log()


def test_a_missing_task_user_is_explained(harness: AgentHarness) -> None:
    harness.start_agent(root_tasks=False, extra=["--run-as", "no-such-task-user"])
    task = harness.enqueue(py("print('ran')"))
    done = harness.wait_state(task, "failed", "succeeded", timeout=20)
    assert done["state"] == "failed" and "'no-such-task-user' does not exist" in json.dumps(done), done


def test_leftovers_of_a_task_with_its_own_uid_are_killed_when_it_ends(harness: AgentHarness, tmp_path: Path) -> None:
    # A task that escapes its process group (setsid) still dies with it: the uid is its own.
    agent = harness.start_agent(root_tasks=False, extra=["--run-as-range", f"{RANGE[0]}-{RANGE[1]}",
                                                        "--work-dir", "/tmp/autoscaler-agent-test"])  # fmt: skip
    del agent
    task = harness.enqueue([SH, "-c", 'setsid sleep 300 & echo "daemon $!"; sleep 0.5; id -u'])
    done = harness.wait_state(task, "succeeded", "failed", timeout=20)
    out = harness.logs(task)
    assert done["state"] == "succeeded", out
    pid = int(out.split("daemon ", 1)[1].split()[0])
    uid = int(out.strip().splitlines()[-1])
    assert RANGE[0] <= uid <= RANGE[1]

    def gone() -> bool:
        st = Path(f"/proc/{pid}/status")
        return not st.exists() or "State:\tZ" in st.read_text()

    wait_for("the escaped process to be killed", gone, timeout=10)
