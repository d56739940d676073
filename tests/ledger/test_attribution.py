"""Exact attribution through the real code: a task pays for the GPUs it holds on a
machine another team launched, and every surface that shows money (ledger report, the
spend API, policy input, dashboard, `/metrics`, `autoscaler spend`, `autoscaler task
show`) shows the same figures. Plus: GPU-less machines, `unused_cost: shared`, an
attempt whose machine is only known later, requeued attempts."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from autoscaler.auth.tokens import create_token
from autoscaler.cli import _register, app
from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.ledger import accrue, burn_rate, month_to_date, shared_pools, spend_report
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as worker_ops
from autoscaler.reconciler.snapshot import observe, policy_input
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, SpendRecord, TaskAttempt, new_id
from autoscaler.web.pages import _spend as dashboard_spend
from tests.conftest import TEST_CONFIG, LiveServer, issue_token, make_context
from tests.test_metrics import scrape, value

T0 = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)
runner = CliRunner()
_register()


def _machine(
    s: Session,
    *,
    team: str | None,
    gpus: int,
    price: float,
    at: datetime,
    pool: str = "gpu-pool",
    provider_instance_id: str | None = None,
) -> Instance:
    inst = Instance(
        request_id=new_id(),
        provider="fake",
        pool=pool,
        instance_type="g.2" if gpus else "c.1",
        capacity_type="on_demand",
        region="local",
        gpus=gpus,
        state="ready",
        team=team,
        hourly_price=price,
        provider_instance_id=provider_instance_id or f"pi-{new_id()[:8]}",
        created_at=at,
        updated_at=at,
        launched_at=at,
        ready_at=at,
    )
    s.add(inst)
    s.flush()
    return inst


def _worker(s: Session, inst: Instance, *, gpus: int, at: datetime) -> str:
    _, join = create_token(s, kind="join", now=at, pool=inst.pool, ttl=timedelta(hours=1))
    reg = worker_ops.Registration(
        hostname=f"h-{inst.id[:6]}",
        instance_id=inst.provider_instance_id or "",
        provider="fake",
        pool=inst.pool,
        gpus=[{"index": i, "model": "A10G"} for i in range(gpus)],
        cpus=4,
        memory_mb=1000,
        simulated_gpus=True,
        agent_version="t",
    )
    worker, _ = worker_ops.register(s, join, reg, now=at)
    return worker.id


def _run_task(
    sessions: sessionmaker[Session], worker: str, *, team: str, queue: str, gpus: int, start: datetime, end: datetime
) -> str:
    with transaction(sessions) as s:
        task_ops.enqueue(s, task_ops.TaskSpec(queue=queue, command=["train"], gpus=gpus), team=team, now=start)
    with transaction(sessions) as s:
        task = task_ops.lease(s, worker, now=start)
        assert task is not None and task.team == team
        task_ops.mark_started(s, worker, task.id, now=start)
        task_id = task.id
    with transaction(sessions) as s:
        task_ops.finish(s, worker, task_id, now=end, reason="exit", exit_code=0)
    return task_id


def test_reviewers_probe_every_surface_shows_the_same_split(
    config: AutoscalerConfig, sessions: sessionmaker[Session]
) -> None:
    """vision's demand launched a 2-GPU machine; nlp leases one GPU of it for an hour:
    nlp pays half the machine for that hour, vision the rest."""
    ctx = make_context(config, sessions, ManualClock(T0 + HOUR))
    with transaction(sessions) as s:
        inst = _machine(s, team="vision", gpus=2, price=4.0, at=T0)
        worker = _worker(s, inst, gpus=2, at=T0)
    with transaction(sessions) as s:
        task_ops.enqueue(s, task_ops.TaskSpec(queue="gpu", command=["train"], gpus=1), team="nlp", now=T0)
    with transaction(sessions) as s:
        task = task_ops.lease(s, worker, now=T0)
        assert task is not None
        task_ops.mark_started(s, worker, task.id, now=T0 + timedelta(minutes=1))
        task_id = task.id
    # Half way: the burn rate is already split by the GPUs held now.
    with transaction(sessions) as s:
        accrue(s, now=T0 + HOUR / 2, since=T0)
        assert burn_rate(s) == {"nlp": pytest.approx(2.0), "vision": pytest.approx(2.0)}
        mid = policy_input(observe(s, config, now=T0 + HOUR / 2, pool_state={}), config)
    mid_teams = {t.name: t for t in mid.teams}
    assert mid_teams["nlp"].month_to_date_usd == pytest.approx(1.0)
    assert mid_teams["nlp"].burn_rate_usd_per_hour == pytest.approx(2.0)
    assert mid_teams["vision"].burn_rate_usd_per_hour == pytest.approx(2.0)
    with transaction(sessions) as s:
        task_ops.finish(s, worker, task_id, now=T0 + HOUR, reason="exit", exit_code=0)
    with transaction(sessions) as s:
        accrue(s, now=T0 + HOUR, since=T0 + HOUR / 2)
    expected = {"nlp": 2.0, "vision": 2.0}

    with sessions() as s:
        assert month_to_date(s, T0) == pytest.approx(expected)
        ledger = {r.team: r.month_to_date_usd for r in spend_report(s, now=T0 + HOUR)}
        pin = policy_input(observe(s, config, now=T0 + HOUR, pool_state={}), config)
        dash = {t.team: t for t in dashboard_spend(ctx, s, None)}
        (attempt,) = s.scalars(select(TaskAttempt)).all()
        kinds = {(r.team, r.kind): r.cost_usd for r in s.scalars(select(SpendRecord))}
    assert ledger == pytest.approx(expected)
    assert {t.name: t.month_to_date_usd for t in pin.teams if t.month_to_date_usd} == pytest.approx(expected)
    # The task ended: the idle machine burns for its launcher only, everywhere.
    assert {t.name: t.burn_rate_usd_per_hour for t in pin.teams if t.burn_rate_usd_per_hour} == {"vision": 4.0}
    assert {t: d.month_to_date_usd for t, d in dash.items() if d.month_to_date_usd} == pytest.approx(expected)
    assert dash["vision"].burn_usd_per_hour == 4.0 and dash["nlp"].burn_usd_per_hour == 0.0
    assert (attempt.task_id, attempt.team, attempt.instance_id, attempt.gpus) == (task_id, "nlp", inst.id, 1)
    assert (attempt.cost_usd, attempt.gpu_hours) == (pytest.approx(2.0), pytest.approx(1.0))
    assert kinds == {("nlp", "usage"): pytest.approx(2.0), ("vision", "unused"): pytest.approx(2.0)}

    admin = issue_token(ctx, "admin")
    server = LiveServer(ctx).start()
    try:
        samples = scrape(server.url, admin)
        api = httpx.get(f"{server.url}/api/v1/spend", headers={"Authorization": f"Bearer {admin}"}, timeout=10).json()
        base = ["--server", server.url, "--token", admin]
        spend_run = runner.invoke(app, ["spend", "--month", "2026-03", "--format", "json", *base])
        show_run = runner.invoke(app, ["task", "show", task_id, "--json", *base])
        show_table = runner.invoke(app, ["task", "show", task_id, *base])
    finally:
        server.stop()
    for team, usd in expected.items():
        assert value(samples, "autoscaler_team_spend_usd", team=team) == pytest.approx(usd)
    assert value(samples, "autoscaler_team_burn_usd_per_hour", team="vision") == pytest.approx(4.0)
    assert value(samples, "autoscaler_team_burn_usd_per_hour", team="nlp") == pytest.approx(0.0)
    assert {t["team"]: t["month_to_date_usd"] for t in api["teams"]} == pytest.approx(expected)
    assert spend_run.exit_code == 0, spend_run.output
    report = json.loads(spend_run.output)
    by_team: dict[str, float] = {}
    for row in report["rows"]:
        by_team[row["x_Team"]] = by_team.get(row["x_Team"], 0.0) + row["BilledCost"]
    assert by_team == pytest.approx(expected) and report["total_usd"] == pytest.approx(4.0)
    assert show_run.exit_code == 0, show_run.output
    shown = json.loads(show_run.output)
    assert shown["cost_usd"] == pytest.approx(2.0) and shown["gpu_hours"] == pytest.approx(1.0)
    assert [(a["attempt"], a["instance_id"], a["cost_usd"]) for a in shown["attempt_costs"]] == [
        (1, inst.id, pytest.approx(2.0))
    ]
    assert show_table.exit_code == 0 and "cost: 2.0000 USD" in show_table.output


def test_gpu_less_machine_and_shared_unused(tmp_path: Path, sessions: sessionmaker[Session]) -> None:
    """A task on a GPU-less machine holds all of it; a pool with `unused_cost: shared`
    charges free capacity to "shared" instead of the launcher."""
    text = TEST_CONFIG.replace(
        "    instance_types: [{name: c.1,", "    unused_cost: shared\n    instance_types: [{name: c.1,"
    )
    config = parse_config(text, tmp_path / "a.yaml")
    shared = shared_pools(config)
    assert shared == {"cpu-pool"}
    make_context(config, sessions)
    with transaction(sessions) as s:
        cpu = _machine(s, team="vision", gpus=0, price=1.0, at=T0, pool="cpu-pool")
        worker = _worker(s, cpu, gpus=0, at=T0)
    _run_task(sessions, worker, team="nlp", queue="cpu", gpus=0, start=T0 + HOUR, end=T0 + 3 * HOUR)
    with transaction(sessions) as s:
        accrue(s, now=T0 + 4 * HOUR, since=T0, shared=shared)
    with sessions() as s:
        assert month_to_date(s, T0) == pytest.approx({"nlp": 2.0, "shared": 2.0})
        (attempt,) = s.scalars(select(TaskAttempt)).all()
    assert attempt.cost_usd == pytest.approx(2.0) and attempt.gpu_hours == 0.0


def test_attempt_resolved_later_and_requeued_attempts(
    config: AutoscalerConfig, sessions: sessionmaker[Session]
) -> None:
    """A worker whose instance is not known at lease is linked when the ledger accrues;
    an interrupted attempt and its retry are charged separately."""
    make_context(config, sessions)
    with transaction(sessions) as s:
        inst = _machine(s, team=None, gpus=1, price=3.0, at=T0, provider_instance_id="pi-late")
        worker = _worker(s, inst, gpus=1, at=T0)
        # As if the provider had not reported the machine's id yet, so nothing links them.
        inst.provider_instance_id = None
        inst.worker_id = None
    with transaction(sessions) as s:
        task_ops.enqueue(s, task_ops.TaskSpec(queue="gpu", command=["x"], gpus=1), team="vision", now=T0)
    with transaction(sessions) as s:
        task = task_ops.lease(s, worker, now=T0)
        assert task is not None
        task_ops.mark_started(s, worker, task.id, now=T0)
        task_id = task.id
    with transaction(sessions) as s:
        task_ops.finish(s, worker, task_id, now=T0 + HOUR, reason="interrupted", detail="drain")
    with sessions() as s:
        assert s.scalars(select(TaskAttempt.instance_id)).all() == [None]
    with transaction(sessions) as s:
        s.get_one(Instance, inst.id).provider_instance_id = "pi-late"
        again = task_ops.lease(s, worker, now=T0 + 2 * HOUR)
        assert again is not None and again.id == task_id and again.attempts == 2
        task_ops.mark_started(s, worker, task_id, now=T0 + 2 * HOUR)
    with transaction(sessions) as s:
        task_ops.finish(s, worker, task_id, now=T0 + 2.5 * HOUR, reason="exit", exit_code=0)
    with transaction(sessions) as s:
        accrue(s, now=T0 + 3 * HOUR, since=T0)
    with sessions() as s:
        rows = s.scalars(select(TaskAttempt).order_by(TaskAttempt.attempt)).all()
        assert month_to_date(s, T0) == pytest.approx({"vision": 4.5, "shared": 4.5})
    assert [(a.attempt, a.instance_id, round(a.cost_usd, 6)) for a in rows] == [(1, inst.id, 3.0), (2, inst.id, 1.5)]
