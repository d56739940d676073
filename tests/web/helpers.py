"""Helpers shared by the visibility tests: a config with budgets in a real policy data
directory, a worker driven through the real agent API, and ledger-shaped spend rows
(inserted as fixture state, the way the ledger writes them)."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import yaml

from autoscaler.api.context import AppContext
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, SpendRecord, new_id
from tests.conftest import TEST_CONFIG


def budget_config(policy_dir: Path, budgets: dict[str, float]) -> AutoscalerConfig:
    (policy_dir / "data").mkdir(parents=True, exist_ok=True)
    doc = {
        "default": {"monthly_usd": None},
        "teams": {t: {"monthly_usd": usd, "kind": "hard"} for t, usd in budgets.items()},
    }
    (policy_dir / "data" / "budgets.yaml").write_text(yaml.safe_dump(doc))
    config = parse_config(TEST_CONFIG, Path("test.yaml"))
    return config.model_copy(update={"policy": config.policy.model_copy(update={"dir": str(policy_dir)})})


class Agent:
    """A worker speaking the agent protocol over HTTP, step by step."""

    def __init__(self, url: str, admin_token: str, pool: str = "gpu-pool", instance_id: str = "i-test") -> None:
        self.http = httpx.Client(base_url=url, timeout=10)
        join = self._ok(
            self.http.post(
                "/api/v1/tokens",
                json={"kind": "join", "pool": pool},
                headers={"Authorization": f"Bearer {admin_token}"},
            )
        )["token"]
        reg = self._ok(
            self.http.post(
                "/api/v1/workers/register",
                json={
                    "hostname": f"host-{instance_id}",
                    "instance_id": instance_id,
                    "provider": "fake",
                    "pool": pool,
                    "gpus": [{"index": 0, "model": "A10G", "memory_mb": 24000}],
                },
                headers={"Authorization": f"Bearer {join}"},
            )
        )
        self.id: str = reg["worker_id"]
        self.http.headers["Authorization"] = f"Bearer {reg['worker_token']}"

    @staticmethod
    def _ok(response: httpx.Response) -> Any:
        assert response.status_code < 400, response.text
        return response.json()

    def lease(self) -> dict[str, Any]:
        task = self._ok(self.http.post(f"/api/v1/workers/{self.id}/lease"))["task"]
        assert task is not None, "nothing to lease"
        return dict(task)

    def start(self, task_id: str) -> None:
        self._ok(self.http.post(f"/api/v1/workers/{self.id}/tasks/{task_id}/start"))

    def log(self, task_id: str, text: str) -> None:
        self._ok(
            self.http.post(
                f"/api/v1/workers/{self.id}/tasks/{task_id}/logs",
                json={"chunks": [{"stream": "stdout", "data": text}]},
            )
        )

    def finish(self, task_id: str, exit_code: int = 0) -> None:
        self._ok(
            self.http.post(
                f"/api/v1/workers/{self.id}/tasks/{task_id}/finish",
                json={"reason": "exit", "exit_code": exit_code},
            )
        )

    def close(self) -> None:
        self.http.close()


def enqueue(url: str, token: str, command: list[str], queue: str = "gpu", gpus: int = 1) -> dict[str, Any]:
    response = httpx.post(
        f"{url}/api/v1/tasks",
        json={"queue": queue, "command": command, "gpus": gpus},
        headers={"Authorization": f"Bearer {token}"},
        timeout=10,
    )
    assert response.status_code == 201, response.text
    return dict(response.json())


def add_instance(
    ctx: AppContext,
    *,
    team: str,
    now: datetime,
    state: str = "ready",
    price: float = 1.0,
    capacity_type: str = "spot",
    provider_instance_id: str | None = None,
) -> str:
    with transaction(ctx.sessions) as s:
        row = Instance(
            request_id=new_id(),
            provider="fake",
            pool="gpu-pool",
            instance_type="g.1",
            capacity_type=capacity_type,
            region="local",
            gpus=1,
            gpu_type="A10G",
            state=state,
            team=team,
            hourly_price=price,
            provider_instance_id=provider_instance_id,
            created_at=now - timedelta(hours=2),
            updated_at=now,
            launched_at=now - timedelta(hours=2),
        )
        s.add(row)
        s.flush()
        return row.id


def add_spend(
    ctx: AppContext,
    *,
    team: str,
    start: datetime,
    hours: float,
    price: float,
    instance_id: str = "inst-1",
    capacity_type: str = "spot",
) -> None:
    end = start + timedelta(hours=hours)
    with transaction(ctx.sessions) as s:
        s.add(
            SpendRecord(
                instance_id=instance_id,
                team=team,
                pool="gpu-pool",
                provider="fake",
                region="local",
                instance_type="g.1",
                capacity_type=capacity_type,
                start=start,
                end=end,
                hourly_price=price,
                cost_usd=price * hours,
            )
        )
