"""A task no pool of its queue could ever run is refused at enqueue (422, naming the
largest shape there); one queued before a config took its shape away is marked
unschedulable, which its team sees. Through the real API, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from autoscaler.admission.fit import Need
from autoscaler.admission.shapes import Catalog
from autoscaler.api.app import create_app
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.reconciler.snapshot import observe
from autoscaler.server import build_runtime
from autoscaler.state.db import transaction
from tests.conftest import issue_token

POOLS = """
pools:
  - name: gpu-pool
    provider: fake
    instance_types: [{name: g.2, gpus: 2, gpu_type: A10G, cpus: 8, memory_mb: 32000, on_demand_price: 1.0}]
  - name: small
    provider: fake
    instance_types: [{name: s.1, gpus: 1, gpu_type: A10G, cpus: 4, memory_mb: 16000, on_demand_price: 1.0}]
  - name: big
    provider: fake
    instance_types:
      - {name: p5, gpus: 8, gpu_type: "NVIDIA H100 80GB HBM3", cpus: 96, memory_mb: 1000000, on_demand_price: 9.0}
  - name: gh-pool
    provider: fake
    instance_types: [{name: gh.1, gpus: 1, gpu_type: GH100, cpus: 72, memory_mb: 480000, on_demand_price: 5.0}]
  - name: cpu-pool
    provider: fake
    instance_types: [{name: c.1, cpus: 1, memory_mb: 2048, on_demand_price: 0.1}]
  - name: joined
    provider: static
"""
CONFIG = (
    """
deployment: test
teams: [{name: vision}, {name: nlp}]
queues:
  - {name: gpu, pools: [gpu-pool]}
  - {name: mixed, pools: [small, big]}
  - {name: gh, pools: [gh-pool]}
  - {name: cpu, pools: [cpu-pool]}
  - {name: onprem, pools: [joined]}
"""
    + POOLS
)
# The same deployment after the big pool was removed.
SHRUNK = CONFIG.replace("pools: [small, big]", "pools: [small]")
GPU_16 = (
    "no pool of queue gpu has a machine with 16 GPUs (largest: 2x A10G, 8 CPUs, 32000 MB in pool gpu-pool); "
    "ask for at most 2 GPUs or use a queue with bigger machines"
)


@pytest.fixture
def config() -> AutoscalerConfig:
    return parse_config(CONFIG, Path("test.yaml"))


@pytest.fixture
def api(ctx: Any) -> tuple[TestClient, dict[str, str]]:
    client = TestClient(create_app(ctx))
    return client, {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}


def _post(api: tuple[TestClient, dict[str, str]], queue: str, **fields: Any) -> Any:
    client, team = api
    return client.post("/api/v1/tasks", headers=team, json={"queue": queue, "command": ["true"], **fields})


def test_the_reviewers_examples_are_refused_naming_the_largest_shape(api: Any) -> None:
    r = _post(api, "cpu", cpus=64, memory_mb=500000)
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert "64 CPUs and 500000 MB of memory" in detail and "largest: 1 CPU, 2048 MB in pool cpu-pool" in detail
    assert "\n" not in detail
    r = _post(api, "gpu", gpus=16)
    assert r.status_code == 422 and r.json()["detail"] == GPU_16
    r = _post(api, "gpu", gpus=1, gpu_type="H100")
    assert r.status_code == 422
    assert "1 H100 GPU" in r.json()["detail"] and "GPU types offered: A10G" in r.json()["detail"]
    # Nothing refused was stored.
    client, team = api
    assert client.get("/api/v1/tasks", headers=team).json() == []


def test_a_task_that_fits_exactly_is_accepted_and_one_more_is_not(api: Any) -> None:
    exact = {"gpus": 2, "gpu_type": "A10G", "cpus": 8, "memory_mb": 32000}
    r = _post(api, "gpu", **exact)
    assert r.status_code == 201 and r.json()["unschedulable_reason"] is None
    assert _post(api, "gpu", **{**exact, "cpus": 8.5}).status_code == 422
    r = _post(api, "gpu", **{**exact, "memory_mb": 32001})
    assert r.status_code == 422 and "at most 32000 MB" in r.json()["detail"]
    assert _post(api, "gpu", **{**exact, "gpus": 3}).status_code == 422


@pytest.mark.parametrize(
    "queue,gpu_type,ok",
    [
        ("gpu", "A10G", True),
        ("gpu", "a10g", True),
        ("gpu", "NVIDIA A10G", True),
        ("gpu", "A10", False),  # a substring, not the same GPU
        ("gpu", "H100", False),
        ("mixed", "H100", True),
        ("mixed", "h100-sxm", True),  # alias of the SXM part, which reports "H100 80GB HBM3"
        ("mixed", "H100 80GB", True),
        ("mixed", "A100", False),
        ("gh", "H100", False),  # GH100 (Grace Hopper) is not an H100
        ("gh", "GH100", True),
    ],
)
def test_gpu_type_by_words_and_aliases(api: Any, queue: str, gpu_type: str, ok: bool) -> None:
    r = _post(api, queue, gpus=1, gpu_type=gpu_type)
    assert r.status_code == (201 if ok else 422), r.text


def test_a_queue_with_two_pools_accepts_what_one_of_them_fits(api: Any) -> None:
    assert _post(api, "mixed", gpus=8, gpu_type="H100").status_code == 201
    assert _post(api, "mixed", gpus=1, cpus=64).status_code == 201  # only the big pool has 64 CPUs
    r = _post(api, "mixed", gpus=8, gpu_type="A10G")  # the A10G pool has 1 GPU a machine
    assert r.status_code == 422 and "8 A10G GPUs" in r.json()["detail"]
    assert "NVIDIA H100 80GB HBM3" in r.json()["detail"]
    r = _post(api, "mixed", gpus=9)
    assert r.status_code == 422 and "largest: 8x NVIDIA H100 80GB HBM3, 96 CPUs, 1000000 MB in pool big" in r.text


def test_cpu_only_tasks_on_cpu_pools(api: Any) -> None:
    assert _post(api, "cpu").status_code == 201
    assert _post(api, "cpu", cpus=1, memory_mb=2048).status_code == 201
    assert _post(api, "cpu", cpus=0.5).status_code == 201
    r = _post(api, "cpu", gpus=1)
    assert r.status_code == 422 and "no GPUs" in r.json()["detail"]
    assert _post(api, "gpu", cpus=2).status_code == 201  # a CPU-only task may use a GPU pool's machine


def test_a_pool_whose_shapes_the_config_does_not_know_refuses_nothing(api: Any) -> None:
    # A static pool without declared machines: whatever joins with its token may be any size.
    assert _post(api, "onprem", gpus=64, gpu_type="B200", cpus=512, memory_mb=4_000_000).status_code == 201


def _restart(config_text: str, db_url: str, home: Path) -> Any:
    """What a restart with a new config does: `build_runtime` (sync queues, review tasks)."""
    cfg = parse_config(config_text, Path("autoscaler.yaml")).model_copy(update={"database_url": db_url})
    return build_runtime(cfg, home, full_loop=False)


def test_a_config_change_marks_a_queued_task_unschedulable_and_its_team_sees_why(
    api: Any, db_url: str, tmp_path: Path
) -> None:
    big = _post(api, "mixed", gpus=8, gpu_type="H100").json()
    small = _post(api, "mixed", gpus=1).json()
    runtime = _restart(SHRUNK, db_url, tmp_path / "home")
    ctx = runtime.ctx
    client = TestClient(create_app(ctx))
    vision = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    nlp = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='nlp')}"}
    shown = client.get(f"/api/v1/tasks/{big['id']}", headers=vision).json()
    reason = shown["unschedulable_reason"]
    assert shown["state"] == "queued"
    assert reason.startswith("no pool of queue mixed has a machine with 8 GPUs (largest: 1x A10G")
    assert client.get(f"/api/v1/tasks/{small['id']}", headers=vision).json()["unschedulable_reason"] is None
    assert client.get(f"/api/v1/tasks/{big['id']}", headers=nlp).status_code == 404
    listed = {t["id"]: t for t in client.get("/api/v1/tasks", headers=vision).json()}
    assert listed[big["id"]]["unschedulable_reason"] == reason
    # The task page says it too.
    assert client.post("/login", data={"token": vision["Authorization"][7:]}, follow_redirects=False).status_code == 303
    page = client.get(f"/tasks/{big['id']}")
    assert page.status_code == 200 and "Unschedulable" in page.text and "8 GPUs" in page.text
    # The planner is not asked for machines it can never get.
    with ctx.sessions() as s:
        demand = observe(s, ctx.config, now=ctx.clock.now(), pool_state={}).demand
    assert [(g.queue, g.gpus, g.count) for g in demand] == [("mixed", 1, 1)]
    # A later config with the big pool again: schedulable again.
    ctx = _restart(CONFIG, db_url, tmp_path / "home").ctx
    with ctx.sessions() as s:
        demand = observe(s, ctx.config, now=ctx.clock.now(), pool_state={}).demand
    assert sorted((g.gpus, g.count) for g in demand) == [(1, 1), (8, 1)]
    again = TestClient(create_app(ctx)).get(f"/api/v1/tasks/{big['id']}", headers=vision).json()
    assert again["unschedulable_reason"] is None and again["state"] == "queued"


def test_a_leased_task_loses_a_stale_reason(ctx: Any) -> None:
    from autoscaler.queueing import tasks as ops
    from autoscaler.queueing.unschedulable import review_queued
    from autoscaler.state.models import Task

    with transaction(ctx.sessions) as s:
        task = ops.enqueue(s, ops.TaskSpec(queue="cpu", command=["x"]), team="vision", now=ctx.clock.now())
        task.state, task.unschedulable_reason = "leased", "stale"
        task_id = task.id
    with transaction(ctx.sessions) as s:
        assert review_queued(s, Catalog.from_config(ctx.config)) == {"marked": 0, "cleared": 1}
    with ctx.sessions() as s:
        assert s.get(Task, task_id).unschedulable_reason is None  # type: ignore[union-attr]


def test_shapes_the_config_does_not_declare_are_not_checked() -> None:
    cfg = parse_config(
        """
queues: [{name: q, pools: [onprem]}, {name: n, pools: [named]}, {name: l, pools: [desk]}, {name: s, pools: [sl]}]
pools:
  - name: onprem
    provider: static
    instance_types: [{name: dgx, gpus: 8, gpu_type: A100}]
    options: {machines: [{name: dgx-01, gpus: 8, gpu_type: A100}, {name: box, gpus: 2}]}
  - name: named
    provider: static
    options: {machines: [dgx-01]}
  - name: desk
    provider: local
    simulated_gpus: {count: 2, model: Simulated A10G}
  - name: sl
    provider: slurm
    instance_types: [{name: slurm.1gpu, gpus: 1, cpus: 8, memory_mb: 64000}]
""",
        Path("x.yaml"),
    )
    cat = Catalog.from_config(cfg)
    # dgx declares no CPUs or memory (the defaults are placeholders): not checked.
    assert cat.refusal("q", ["onprem"], Need(gpus=8, gpu_type="A100", cpus=64, memory_mb=10**6)) is None
    # "box" declares no GPU type: a typed wish is not refused on its account.
    assert cat.refusal("q", ["onprem"], Need(gpus=2, gpu_type="H100")) is None
    refused = cat.refusal("q", ["onprem"], Need(gpus=9))
    assert refused is not None and "largest: 8x A100 in pool onprem" in refused
    assert cat.refusal("n", ["named"], Need(gpus=99)) is None  # a machine by name only: unknown
    assert cat.refusal("l", ["desk"], Need(gpus=2, gpu_type="A10G")) is None
    assert cat.refusal("l", ["desk"], Need(gpus=3)) is not None
    assert cat.refusal("s", ["sl"], Need(gpus=1, cpus=8, memory_mb=64000)) is None
    assert cat.refusal("s", ["sl"], Need(gpus=1, cpus=16)) is not None
    assert cat.refusal("x", ["not-in-config"], Need(gpus=99)) is None
