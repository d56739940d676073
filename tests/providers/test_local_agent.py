"""A local instance runs the real agent, which registers with the live server using the
one-time join token from its bootstrap, reports its simulated GPUs, and stops on terminate."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from providers.base import LaunchRequest
from providers.bootstrap import BootstrapSpec, render_user_data
from providers.local import LocalProvider, LocalRecord, default_offering
from tests.conftest import LiveServer, issue_token

POOL = "gpu-pool"
SIM = {"count": 2, "model": "Simulated A10G", "memory_mb": 24576}


def workers(server: LiveServer, admin: str) -> list[dict[str, Any]]:
    resp = httpx.get(f"{server.url}/api/v1/workers", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    resp.raise_for_status()
    result: list[dict[str, Any]] = resp.json()
    return result


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_local_instance_registers_with_the_live_server(
    live_server: LiveServer, admin_token: str, tmp_path: Path
) -> None:
    token = issue_token(live_server.ctx, "join", pool=POOL, ttl=timedelta(minutes=10))
    spec = BootstrapSpec(server_url=live_server.url, pool=POOL, provider="local", join_token=token)
    local = LocalProvider([], pool=POOL, home=tmp_path, simulated_gpus=SIM, stop_grace_s=10)
    request = LaunchRequest(
        request_id="req-local-agent",
        pool=POOL,
        owner="test",
        offering=default_offering(SIM),
        user_data=render_user_data(spec),
    )
    (inst,) = local.launch(request)
    log = local.instance_dir(inst.instance_id) / "agent.log"
    try:
        deadline = time.monotonic() + 60
        registered: list[dict[str, Any]] = []
        while not registered:
            assert time.monotonic() < deadline, f"the agent never registered; its log:\n{log.read_text()}"
            assert local.list("test"), f"the agent exited; its log:\n{log.read_text()}"
            registered = [w for w in workers(live_server, admin_token) if w["instance_id"] == inst.instance_id]
            time.sleep(0.2)
        (worker,) = registered
        assert worker["provider"] == "local" and worker["pool"] == POOL
        assert worker["simulated_gpus"] is True
        assert worker["gpu_count"] == 2 and worker["gpu_type"] == "Simulated A10G"
    finally:
        local.terminate([inst.instance_id])
    pid = LocalRecord.load(local.instance_dir(inst.instance_id) / "instance.json").pid
    assert pid is not None
    assert local.list("test") == []
    stat = Path(f"/proc/{pid}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", "the agent is stopped"
