"""`autoscaler up` as a real process on the example local config, for end-to-end tests.

`local_up(tmp_path, ...)` writes `examples/local.yaml` with a free port and the
reconcile settings a test asks for, starts `autoscaler up` in its own session with a
home under `tmp_path`, waits for `/healthz` and yields a `LocalUp`: the process, its
URL, home, log and an admin `httpx.Client`. On exit it sends SIGINT (what Ctrl-C
sends) and kills the process group if it has not stopped in time; a test that stops
the process itself is left alone. `until()` polls a probe and fails with the server
log's tail, which is where the reason a wait ran out is.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.conftest import REPO, free_port
from tests.waiting import wait_for


def until(what: str, probe: Callable[[], Any], timeout_s: float, log: Path) -> Any:
    """The probe's first truthy value within `timeout_s`, polled every 0.25 s; a timeout
    shows the server's log."""
    return wait_for(what, probe, timeout_s, every=0.25, describe=lambda: f"server log:\n{log.read_text()[-6000:]}")


def kill_rank_agent(api: httpx.Client, home: Path, task_id: str, rank: int) -> str:
    """SIGKILL the local machine that runs `rank` of a gang (its agent and all); returns
    the killed worker's id."""
    ranks = api.get(f"/api/v1/tasks/{task_id}").json()["ranks"]
    victim = next(r["worker_id"] for r in ranks if r["rank"] == rank)
    worker = api.get(f"/api/v1/workers/{victim}").json()
    record = json.loads((home / "local-instances" / worker["instance_id"] / "instance.json").read_text())
    os.kill(record["pid"], signal.SIGKILL)
    return str(victim)


def until_requeued(api: httpx.Client, task_id: str, timeout_s: float, log: Path) -> dict[str, Any]:
    """The task once it has been interrupted and requeued at least once."""

    def requeued() -> dict[str, Any] | None:
        t: dict[str, Any] = api.get(f"/api/v1/tasks/{task_id}").json()
        return t if t["interruptions"] >= 1 else None

    found: dict[str, Any] = until("the gang to be requeued as one", requeued, timeout_s, log)
    return found


@dataclass
class LocalUp:
    proc: subprocess.Popen[bytes]
    port: int
    home: Path
    log: Path
    api: httpx.Client  # the admin token of `home`

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _healthy(base: str) -> bool:
    try:
        return httpx.get(f"{base}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def local_up(
    tmp_path: Path,
    *,
    reconcile: Mapping[str, Any],
    idle_timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    stop_timeout_s: float = 20,
) -> Iterator[LocalUp]:
    """`reconcile`: keys set in the config's `reconcile:` (its `interval_s` at least: the
    example's suits people, not tests). `idle_timeout_s`: every pool's, when given."""
    cfg = yaml.safe_load((REPO / "examples" / "local.yaml").read_text())
    cfg["policy"]["data_dir"] = str(REPO / "examples" / "policy-data")  # relative to the example, not to this copy
    port = free_port()
    cfg["server"]["port"] = port
    cfg["reconcile"].update(reconcile)
    if idle_timeout_s is not None:
        for pool in cfg["pools"]:
            pool["idle_timeout_s"] = idle_timeout_s
    config_path = tmp_path / "autoscaler.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    log = tmp_path / "up.log"
    home = tmp_path / "home"
    environ = {**os.environ, "AUTOSCALER_HOME": str(home), "PYTHONUNBUFFERED": "1", **(env or {})}
    environ.pop("AUTOSCALER_CONFIG", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "up", "-c", str(config_path)],
            env=environ,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
        )
    try:
        base = f"http://127.0.0.1:{port}"
        until("the server", lambda: _healthy(base), 60, log)
        token = (home / "admin.token").read_text().strip()
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10) as api:
            yield LocalUp(proc, port, home, log, api)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
