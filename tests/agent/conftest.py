"""Harness for agent tests: real agent processes (`python -m autoscaler agent`) against
the real server on 127.0.0.1, with NVML and cloud metadata faked at the edge.

Agent end-to-end tests run on SQLite by default (each costs seconds of wall time); a
representative few also run on PostgreSQL through `BOTH_BACKENDS`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from autoscaler.agent.settings import agent_env_names
from autoscaler.api.context import AppContext
from autoscaler.queueing.workers import expire_silent_workers
from autoscaler.state.db import transaction
from autoscaler.state.models import Worker
from tests.conftest import REPO, LiveServer, issue_token
from tests.fakes import nvml
from tests.waiting import wait_for

BOTH_BACKENDS = pytest.mark.parametrize(
    "db_url", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
# Intervals shrunk so a whole agent lifecycle takes a few seconds.
FAST = [
    "--heartbeat-interval",
    "0.2",
    "--lease-interval",
    "0.2",
    "--log-flush",
    "0.2",
    "--notice-interval",
    "0.2",
    "--kill-grace",
    "1",
    "--preempt-grace",
    "1",
    "--drain-deadline",
    "1",
    # Long enough that a loaded CI machine loses no lease answer to a client timeout:
    # a lost answer is recovered by the server only after LEASE_TTL (90 s), which these
    # tests' waits do not cover (tests/queueing/test_lease.py proves that recovery).
    "--request-timeout",
    "8",
    "--backoff-max",
    "0.5",
    "--register-timeout",
    "20",
]
PY = sys.executable


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> str:
    backend = getattr(request, "param", "sqlite")
    return str(request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url"))


class AgentProcess:
    def __init__(self, proc: subprocess.Popen[bytes], log: Path, nvml_script: Path) -> None:
        self.proc = proc
        self.log_path = log
        self.nvml_script = nvml_script  # the fake re-reads it on every call: edit it to change the GPUs

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float = 15.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"agent did not exit in {timeout}s; its log:\n{self.log()}") from None

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)


class AgentHarness:
    """Starts agents against one live server and talks to that server as an admin."""

    def __init__(self, server: LiveServer, tmp: Path) -> None:
        self.server = server
        self.ctx: AppContext = server.ctx
        self.tmp = tmp
        self.agents: list[AgentProcess] = []
        self.admin = httpx.Client(
            base_url=server.url,
            headers={"Authorization": f"Bearer {issue_token(self.ctx, 'admin')}"},
            timeout=10,
        )
        self._shadow = nvml.shadow_dir(tmp / "nvml-shadow")
        self._n = 0

    def join_token(self, pool: str = "gpu-pool") -> str:
        return issue_token(self.ctx, "join", pool=pool, ttl=timedelta(hours=1))

    def start_agent(
        self,
        *,
        gpus: int = 1,
        instance_id: str | None = None,
        token: str | None = None,
        extra: list[str] | None = None,
        nvml_script: dict[str, Any] | None = None,
        pool: str = "gpu-pool",
        use_flags: bool = True,
        root_tasks: bool = True,
    ) -> AgentProcess:
        """An agent process; `use_flags=False` leaves server, pool, provider, instance id
        and join token to the bootstrap file passed in `extra`. `root_tasks`: when the
        tests run as root, tasks run as root too (their commands are this interpreter,
        which the unprivileged task user may not reach); False keeps the agent's default."""
        self._n += 1
        script = nvml_script if nvml_script is not None else {"gpus": nvml.gpus(gpus)}
        script_path = self.tmp / f"nvml-{self._n}.json"
        script_path.write_text(json.dumps(script))
        env = {
            **os.environ,
            "PYTHONPATH": f"{self._shadow}{os.pathsep}{REPO}",
            "FAKE_NVML": str(script_path),
            "PYTHONUNBUFFERED": "1",
        }
        for name in agent_env_names():  # only what this test passes may configure the agent
            env.pop(name, None)
        log = self.tmp / f"agent-{self._n}.log"
        cmd = [PY, "-m", "autoscaler", "agent", "--work-dir", str(self.tmp / f"work-{self._n}"), *FAST]
        cmd += ["--state-dir", str(self.tmp / f"state-{self._n}")]
        if root_tasks and os.geteuid() == 0:
            cmd += ["--run-as", "root", "--allow-root-tasks"]
        if use_flags:
            cmd += ["--server", self.server.url, "--pool", pool, "--provider", "static"]
            if instance_id != "":  # "" = no flag: the agent asks the metadata service
                cmd += ["--instance-id", instance_id or f"i-{self._n:04d}"]
            env["AUTOSCALER_JOIN_TOKEN"] = token or self.join_token(pool)
        cmd += extra or []
        with log.open("wb") as fh:
            proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=self.tmp)
        agent = AgentProcess(proc, log, script_path)
        self.agents.append(agent)
        return agent

    # -- server-side views ---------------------------------------------------------
    def enqueue(self, command: list[str], *, queue: str = "gpu", gpus: int = 1, **kw: Any) -> str:
        body = {"queue": queue, "command": command, "gpus": gpus, "team": "vision", **kw}
        r = self.admin.post("/api/v1/tasks", json=body)
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def task(self, task_id: str) -> dict[str, Any]:
        r = self.admin.get(f"/api/v1/tasks/{task_id}")
        assert r.status_code == 200, r.text
        data: dict[str, Any] = r.json()
        return data

    def wait_state(self, task_id: str, *states: str, timeout: float = 15.0) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            t = self.task(task_id)
            return t if t["state"] in states else None

        return dict(wait_for(f"task {task_id} to become {states}", check, timeout, describe=lambda: self.why(task_id)))

    def why(self, task_id: str) -> str:
        """The task's history and every agent's log tail: what a timed-out wait shows."""
        t = self.task(task_id)
        lines = [f"task {task_id} is {t['state']} (attempt {t['attempts']}, worker {t['worker_id']}); history:"]
        lines += [f"  {e['at']} {e['from_state']} -> {e['to_state']}: {e['reason']} {e['detail']}" for e in t["events"]]
        for n, agent in enumerate(self.agents, 1):
            tail = agent.log().splitlines()[-40:]
            lines += [f"agent {n} (exit code {agent.proc.poll()}), last {len(tail)} log lines:", *tail]
        return "\n".join(lines)

    def logs(self, task_id: str, stream: str | None = None) -> str:
        """The task's uploaded output; stdout and stderr are separate pipes, so only
        the order within one stream is defined."""
        r = self.admin.get(f"/api/v1/tasks/{task_id}/logs")
        assert r.status_code == 200, r.text
        return "".join(c["data"] for c in r.json() if stream in (None, c["stream"]))

    def worker(self, worker_id: str) -> dict[str, Any]:
        data: dict[str, Any] = self.admin.get(f"/api/v1/workers/{worker_id}").json()
        return data

    def workers(self) -> list[dict[str, Any]]:
        data: list[dict[str, Any]] = self.admin.get("/api/v1/workers", params={"include_gone": True}).json()
        return data

    def worker_of(self, instance_id: str) -> dict[str, Any]:
        def find() -> dict[str, Any] | None:
            live = [w for w in self.workers() if w["instance_id"] == instance_id]
            return live[0] if live else None

        return dict(wait_for(f"worker for {instance_id}", find))

    def worker_row(self, worker_id: str) -> Worker:
        """The worker as the reconciler reads it (fields the API does not show)."""
        with self.ctx.sessions() as s:
            row = s.get(Worker, worker_id)
            assert row is not None
            s.expunge(row)
            return row

    def restart_server(self) -> LiveServer:
        """Stop the server and start a fresh one on the same port and database."""
        old = self.server
        old.stop()
        new = LiveServer(old.ctx)
        new.port, new.url = old.port, old.url
        new._server = uvicorn.Server(
            uvicorn.Config(new.app, host="127.0.0.1", port=old.port, log_level="warning", lifespan="off")
        )
        new._thread = threading.Thread(target=new._server.run, daemon=True)
        self.server = new
        return new

    def expire_silent(self, timeout_s: float) -> list[str]:
        """What the server's housekeeping job does, with a test-sized timeout."""
        with transaction(self.ctx.sessions) as s:
            return [w.id for w in expire_silent_workers(s, now=self.ctx.clock.now(), timeout_s=timeout_s)]

    def close(self) -> None:
        for a in self.agents:
            if a.proc.poll() is None:
                a.proc.kill()
                a.proc.wait(5)
        self.admin.close()


@pytest.fixture
def harness(live_server: LiveServer, tmp_path: Path) -> Iterator[AgentHarness]:
    h = AgentHarness(live_server, tmp_path)
    yield h
    h.close()


def py(code: str) -> list[str]:
    """A task command: this interpreter running `code`."""
    return [PY, "-c", code]
