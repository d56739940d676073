"""`autoscaler server --workers N`: PostgreSQL only, and the worker-process app builds from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.config import AutoscalerConfig
from autoscaler.errors import ConfigError
from autoscaler.server import check_workers


def test_several_workers_need_postgresql(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs PostgreSQL"):
        check_workers(AutoscalerConfig(), tmp_path, 2)
    check_workers(AutoscalerConfig(), tmp_path, 1)
    check_workers(AutoscalerConfig(database_url="postgresql://u@127.0.0.1/db"), tmp_path, 4)
    with pytest.raises(ConfigError, match="at least 1"):
        check_workers(AutoscalerConfig(), tmp_path, 0)


def test_app_from_env_serves_healthz(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from autoscaler.server import app_from_env, build_runtime

    build_runtime(AutoscalerConfig(), tmp_path, full_loop=False)  # what the parent does first
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path))
    monkeypatch.delenv("AUTOSCALER_CONFIG", raising=False)
    monkeypatch.delenv("AUTOSCALER_DATABASE_URL", raising=False)
    client = TestClient(app_from_env())
    assert client.get("/healthz").status_code == 200
    token = (tmp_path / "admin.token").read_text().strip()
    assert client.get("/api/v1/whoami", headers={"Authorization": f"Bearer {token}"}).json()["kind"] == "admin"
