"""A real control plane (`autoscaler up`: API + reconciler + embedded policy) as a child
process, for tests that kill it with SIGKILL and start it again on the same database."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import REPO

AMI = "ami-03cf127a"  # one of moto's built-in images


def aws_config(moto_url: str, owner: str, port: int, db_url: str, **reconcile: Any) -> dict[str, Any]:
    return {
        "deployment": owner,
        "database_url": db_url,
        "server": {"port": port},
        "teams": [{"name": "vision"}],
        "queues": [{"name": "gpu", "pools": ["aws-gpu"]}],
        "pools": [
            {
                "name": "aws-gpu",
                "provider": "aws",
                "region": "us-east-1",
                "image": AMI,
                "max_instances": 3,
                "boot_timeout_s": 3,
                "idle_timeout_s": 2,
                "capacity_types": ["on_demand"],
                "instance_types": [
                    {
                        "name": "g5.xlarge",
                        "gpus": 1,
                        "gpu_type": "A10G",
                        "cpus": 4,
                        "memory_mb": 16384,
                        "on_demand_price": 1.0,
                    }
                ],
                "options": {"endpoint_url": moto_url, "launch_api": "run_instances", "max_attempts": 1},
            }
        ],
        "reconcile": {"interval_s": 0.5, "debounce_s": 0.1, "orphan_grace_s": 2, **reconcile},
    }


class ControlPlane:
    def __init__(self, tmp: Path, config: dict[str, Any]) -> None:
        self.home = tmp / "home"
        self.config_path = tmp / "autoscaler.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{config['server']['port']}"
        self.log = tmp / "up.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, **env: str) -> ControlPlane:
        environ = {
            **os.environ,
            "AUTOSCALER_HOME": str(self.home),
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            **env,
        }
        for key in ("AUTOSCALER_CONFIG", "AUTOSCALER_CRASH_AT", "AUTOSCALER_CRASH_SKIP"):
            if key not in env:
                environ.pop(key, None)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "autoscaler", "up", "-c", str(self.config_path)],
                env=environ,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO,
            )
        return self

    def wait_healthy(self, timeout_s: float = 40) -> None:
        until("the control plane to answer", self.healthy, timeout_s, self)

    def healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def api(self) -> httpx.Client:
        token = (self.home / "admin.token").read_text().strip()
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)

    def wait_exit(self, timeout_s: float) -> int | None:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL the whole process group we started (the server and its policy child)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""


def until(what: str, probe: Callable[[], Any], timeout_s: float, cp: ControlPlane | None = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f"; log:\n{cp.tail()}" if cp else ""))
