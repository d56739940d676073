"""How `autoscaler.server` composes a process: typed fields, every router in api.routes.

`autoscaler up` must attach the policy service and the reconciler to the context it
serves; `autoscaler server` must run without them and say so on the policy endpoints,
while spend and alerts still answer. No module outside `api/routes/` (and the
dashboard's pages) may define a router.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

from fastapi.testclient import TestClient

from autoscaler.api.app import create_app
from autoscaler.config import AutoscalerConfig, PoolConfig, QueueConfig, TeamConfig
from autoscaler.policy.service import PolicyService
from autoscaler.reconciler.loop import ReconcileLoop
from autoscaler.server import build_runtime

ROOT = Path(__file__).resolve().parents[1] / "autoscaler"


def _config() -> AutoscalerConfig:
    pool = PoolConfig(name="p", provider="fake", region="r", zones=["z"], instance_types=[])
    return AutoscalerConfig(
        teams=[TeamConfig(name="vision")], queues=[QueueConfig(name="gpu", pools=["p"])], pools=[pool]
    )


def _admin(home: Path) -> dict[str, str]:
    return {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}


def test_up_attaches_the_policy_service_and_the_reconciler(tmp_path: Path) -> None:
    runtime = build_runtime(_config(), tmp_path, full_loop=True)
    try:
        ctx = runtime.ctx
        assert isinstance(ctx.policy, PolicyService)
        assert isinstance(ctx.reconciler, ReconcileLoop)
        assert ctx.wake == ctx.reconciler.wake  # enqueues wake this process's loop
        jobs = {j.id for j in runtime.scheduler.get_jobs()}
        assert {"housekeeping", "unschedulable", "policy-watch", "reconcile"} <= jobs
        assert "alert-delivery" not in jobs  # no channel configured
        client = TestClient(create_app(ctx))
        r = client.get("/api/v1/policy", headers=_admin(tmp_path))
        assert r.status_code == 200 and r.json()["revision"] == ctx.policy.revision
    finally:
        for stop in runtime.on_stop:
            stop()


def test_server_runs_without_them_and_its_policy_endpoints_say_so(tmp_path: Path) -> None:
    runtime = build_runtime(_config(), tmp_path, full_loop=False)
    ctx = runtime.ctx
    assert ctx.policy is None and ctx.reconciler is None
    assert runtime.on_stop == []
    app = create_app(ctx)
    # Every router of api/routes is mounted, whatever the process runs.
    paths = set(app.openapi()["paths"])
    for path in (ROOT / "api" / "routes").glob("[!_]*.py"):
        module = importlib.import_module(f"autoscaler.api.routes.{path.stem}")
        # OpenAPI drops path converters: `{name:path}` is listed as `{name}`.
        mounted = {re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path) for r in module.router.routes}  # type: ignore[attr-defined]
        assert mounted <= paths, path.stem
    client = TestClient(app)
    admin = _admin(tmp_path)
    r = client.post("/api/v1/policy/reload", headers=admin)
    assert r.status_code == 404 and "not running in this process" in r.json()["detail"]
    assert "autoscaler up" in r.json()["detail"]
    # Read-only money and alert views need no loop.
    assert client.get("/api/v1/spend", headers=admin).status_code == 200
    assert client.get("/api/v1/alerts", headers=admin).status_code == 200


def test_routers_live_in_api_routes_only() -> None:
    allowed = {"api/routes", "web/pages.py"}
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "APIRouter"
                and not any(rel.startswith(a) for a in allowed)
            ):
                found.append(f"{rel}:{node.lineno}")
    assert not found, "routers outside autoscaler/api/routes/: " + ", ".join(found)
    routes = {p.stem for p in (ROOT / "api" / "routes").glob("*.py")} - {"__init__"}
    assert routes == {
        "alerts",
        "artifacts",
        "fleet",
        "metrics",
        "policy",
        "queues",
        "reports",
        "spend",
        "tasks",
        "tokens",
        "workers",
    }
