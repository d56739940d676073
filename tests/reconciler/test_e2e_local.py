"""End to end on one machine: `autoscaler up` (a real process: API, reconciler, embedded
policy, local provider) with the example config; a task enqueued over HTTP launches a
local instance (a real agent process), runs, and the idle instance is drained and
terminated."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from tests.local_up import local_up, until


def test_enqueue_launch_run_drain_terminate_on_local_provider(tmp_path: Path) -> None:
    # The example's idle timeout (60 s), shortened for the test.
    with local_up(tmp_path, reconcile={"interval_s": 2}, idle_timeout_s=3) as up:
        api, log = up.api, up.log
        task = api.post(
            "/api/v1/tasks",
            json={
                "queue": "gpu",
                "gpus": 1,
                "team": "vision",
                "command": [sys.executable, "-c", "print(42)"],
            },
        ).json()

        def task_state() -> str | None:
            state = api.get(f"/api/v1/tasks/{task['id']}").json()["state"]
            return state if state in ("succeeded", "failed", "canceled") else None

        assert until("the task to finish", task_state, 40, log) == "succeeded"

        def terminated() -> list[dict[str, Any]] | None:
            rows = api.get("/api/v1/instances", params={"include_terminated": True}).json()
            return rows if rows and all(r["state"] == "terminated" for r in rows) else None

        (inst,) = until("the idle instance to be terminated", terminated, 40, log)
        assert (inst["pool"], inst["team"], inst["provider"]) == ("local-gpu", "vision", "local")
        reasons = [
            line for row in api.get("/api/v1/decisions", params={"limit": 200}).json() for line in row["reasons"]
        ]
        assert any(r.startswith("launch 1 x on_demand/local.2gpu") for r in reasons)
        assert any(r.startswith("drain worker") and "idle for" in r for r in reasons)
        assert any(r.startswith("terminate instance") and "drained" in r for r in reasons)
        spend = api.get("/api/v1/spend").json()
        assert [t["team"] for t in spend["teams"]] == ["vision"] and spend["total_usd"] > 0
        # The server's own log tells the story, one line per event (issue 23 item 7).
        lines = [ln for ln in log.read_text().splitlines() if " INFO autoscaler.lifecycle: " in ln]
        story = "\n".join(lines)
        iid, tid = inst["id"], task["id"]
        assert any(f"instance {iid}" in ln and "launch requested" in ln and "vision" in ln for ln in lines), story
        assert any(f"instance {iid}" in ln and "launching -> booting" in ln for ln in lines), story
        assert any(f"task {tid}" in ln and "queued -> leased" in ln for ln in lines), story
        assert any(f"task {tid}" in ln and "running -> succeeded" in ln for ln in lines), story
        assert any("draining within" in ln and "idle for" in ln for ln in lines), story
        assert any(f"instance {iid}" in ln and "terminating -> terminated" in ln for ln in lines), story
        assert all(len(ln) < 400 for ln in lines), story  # concise


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


@contextmanager
def _killed_at_exit(pids: list[int]) -> Iterator[None]:
    """An agent or task `up` failed to stop is this test's to end, pass or fail."""
    try:
        yield
    finally:
        for p in pids:
            if _pid_alive(p):
                os.kill(p, signal.SIGKILL)


def test_ctrl_c_on_up_stops_every_local_agent_it_started(tmp_path: Path) -> None:
    pids: list[int] = []
    with local_up(tmp_path, reconcile={"interval_s": 2}) as up, _killed_at_exit(pids):
        api, home, log, proc = up.api, up.home, up.log, up.proc
        script = "import os, time\nprint('task pid', os.getpid(), flush=True)\ntime.sleep(600)"
        task = api.post(
            "/api/v1/tasks",
            json={"queue": "gpu", "gpus": 1, "team": "vision", "command": [sys.executable, "-c", script]},
        ).json()
        until("the task to run", lambda: api.get(f"/api/v1/tasks/{task['id']}").json()["state"] == "running", 40, log)

        def task_pid() -> int | None:
            chunks = api.get(f"/api/v1/tasks/{task['id']}/logs").json()
            text = "".join(c["data"] for c in chunks)
            return int(text.split("task pid", 1)[1].split()[0]) if "task pid" in text else None

        pids.append(until("the task's pid", task_pid, 20, log))
        records = [yaml.safe_load(p.read_text()) for p in (home / "local-instances").glob("*/instance.json")]
        pids += [r["pid"] for r in records if r.get("pid")]
        assert len(pids) == 2 and all(_pid_alive(p) for p in pids)

        started = time.monotonic()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C on `make run` sends
        proc.wait(timeout=30)
        took = time.monotonic() - started
        text = log.read_text()
        assert "stopping 1 local agent(s)" in text and "stopped 1 local agent(s)" in text, text[-3000:]
        assert took < 25, f"{took:.1f}s"
        assert not [p for p in pids if _pid_alive(p)], "agent or task left running"
        (agent_log,) = (home / "local-instances").glob("*/agent.log")
        assert "deregistered" in agent_log.read_text()  # it said goodbye while the API answered
