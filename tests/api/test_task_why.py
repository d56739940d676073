"""`GET /api/v1/tasks/{id}/why` and the team-scoped decisions, on both databases.

Admission rows come from real policy `Decision`s (`admissions` + `store.write`), holds
and booting machines from real reconcile cycles (fake provider, shipped policy)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from autoscaler.admission import store as admission_store
from autoscaler.admission.model import admissions
from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from autoscaler.clock import ManualClock
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.policy.service import PolicyService
from autoscaler.queueing import tasks as task_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import Task
from tests.conftest import issue_token, make_context
from tests.reconciler.harness import make_rig, policy_service


@pytest.fixture(scope="module")
def shipped() -> Iterator[PolicyService]:
    svc = policy_service()
    yield svc
    svc.close()


@pytest.fixture
def world(config, sessions, clock: ManualClock):
    ctx = make_context(config, sessions, clock)
    client = TestClient(create_app(ctx))
    vision = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    nlp = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='nlp')}"}
    admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}
    return ctx, client, vision, nlp, admin


def _enqueue(ctx: AppContext, team: str = "vision", gpus: int = 1, queue: str = "gpu", priority: int = 0) -> str:
    with transaction(ctx.sessions) as s:
        spec = task_ops.TaskSpec(queue=queue, command=["true"], gpus=gpus, priority=priority)
        return task_ops.enqueue(s, spec, team=team, now=ctx.clock.now()).id


def _admit(ctx: AppContext, **teams: TeamDecision) -> None:
    with transaction(ctx.sessions) as s:
        admission_store.write(s, admissions(Decision(teams=teams), {}), now=ctx.clock.now())


def _why(client: TestClient, headers: dict[str, str], task_id: str) -> dict:
    r = client.get(f"/api/v1/tasks/{task_id}/why", headers=headers)
    assert r.status_code == 200, r.text
    return r.json()


def test_own_task_only(world) -> None:
    ctx, client, vision, nlp, admin = world
    tid = _enqueue(ctx)
    assert _why(client, vision, tid)["task_id"] == tid
    assert _why(client, admin, tid)["task_id"] == tid
    r = client.get(f"/api/v1/tasks/{tid}/why", headers=nlp)
    assert r.status_code == 404 and tid in r.json()["detail"]
    assert client.get("/api/v1/tasks/nope/why", headers=vision).status_code == 404


def test_admission_reasons(world) -> None:
    ctx, client, vision, _nlp, _admin = world
    tid = _enqueue(ctx)

    _admit(ctx, vision=TeamDecision(may_scale_up=False, reasons=["vision at 95 % of its 100 USD budget"]))
    got = _why(client, vision, tid)
    assert got["code"] == "budget" and "95 % of its 100 USD budget" in got["reason"]
    assert got["details"]["headroom_usd_per_hour"] == 0.0 and "month_to_date_usd" in got["details"]

    _admit(ctx, vision=TeamDecision(spend_headroom_per_hour=0.0, reasons=["forecast over budget"]))
    assert _why(client, vision, tid)["code"] == "budget"

    _admit(ctx, vision=TeamDecision(drain=True, reasons=["over its hard budget"]))
    got = _why(client, vision, tid)
    assert got["code"] == "drained" and "over its hard budget" in got["reason"]

    _admit(ctx, vision=TeamDecision(allowed_pools=["cpu-pool"]))
    got = _why(client, vision, tid)
    assert got["code"] == "placement" and "gpu-pool" in got["reason"] and "cpu-pool" in got["reason"]

    with transaction(ctx.sessions) as s:
        admission_store.write(s, admissions(Decision.failed("boom", ["vision"]), {}), now=ctx.clock.now())
    assert _why(client, vision, tid)["code"] == "policy_failed"


def test_quota_with_borrowing(world) -> None:
    ctx, client, vision, _nlp, _admin = world
    running = _enqueue(ctx, gpus=2)
    with transaction(ctx.sessions) as s:
        t = s.get(Task, running)
        assert t is not None
        t.state = "running"
    tid = _enqueue(ctx, gpus=1)
    _admit(
        ctx,
        vision=TeamDecision(nominal_gpus=1, borrowing_limit_gpus=1),
        nlp=TeamDecision(nominal_gpus=4),
    )
    got = _why(client, vision, tid)
    assert got["code"] == "quota", got
    d = got["details"]
    assert (d["held_gpus"], d["cap_gpus"], d["nominal_gpus"], d["borrowable_gpus"]) == (2, 2, 1, 1)
    assert "holds 2 GPU(s)" in got["reason"] and "nominal 1 + 1 borrowable" in got["reason"]


def test_behind_and_not_queued(world) -> None:
    ctx, client, vision, _nlp, _admin = world
    _admit(ctx)  # every team may grow: nothing but the queue order keeps it
    _enqueue(ctx, team="nlp", priority=5)
    ctx.clock.advance(1)
    _enqueue(ctx, team="vision")
    ctx.clock.advance(1)
    tid = _enqueue(ctx, team="vision")
    _enqueue(ctx, team="nlp", queue="cpu", gpus=0)  # another pool: not ahead
    got = _why(client, vision, tid)
    assert got["code"] == "behind" and got["details"]["ahead"] == 2 and "behind 2 task(s)" in got["reason"]

    with transaction(ctx.sessions) as s:
        t = s.get(Task, tid)
        assert t is not None
        t.state, t.worker_id, t.started_at = "running", "w-123", ctx.clock.now()
    got = _why(client, vision, tid)
    assert got["code"] == "not_queued" and "running on worker w-123 since" in got["reason"]


def test_reconcile_cycle_booting_then_no_fit(world, shipped: PolicyService) -> None:
    ctx, client, vision, _nlp, _admin = world
    rig = make_rig(ctx.sessions, ctx.config, ctx.clock, shipped)
    tid = _enqueue(ctx, gpus=1)
    rig.reconciler().run_cycle()
    got = _why(client, vision, tid)
    assert got["code"] == "booting", got
    assert "boot timeout 900 s" in got["reason"] and got["details"]["eta_from_history"] is False
    assert got["details"]["eta_s"] <= 900

    big = _enqueue(ctx, gpus=4)  # the pool's only offering has 1 GPU
    ctx.clock.advance(timedelta(seconds=5).total_seconds())
    rig.reconciler().run_cycle()
    got = _why(client, vision, big)
    assert got["code"] == "no_fit", got
    assert "held by the last plan" in got["reason"] and got["details"]["hold"]


def test_explain_with_a_team_token_shows_only_that_team(world, shipped: PolicyService) -> None:
    ctx, client, vision, nlp, admin = world
    rig = make_rig(ctx.sessions, ctx.config, ctx.clock, shipped)
    _enqueue(ctx, team="vision", gpus=1)
    _enqueue(ctx, team="nlp", gpus=4)  # held: no shape fits
    rig.reconciler().run_cycle()
    full = client.get("/api/v1/decisions", headers=admin, params={"limit": 1}).json()[0]
    assert "nlp" in str(full) and "vision" in str(full)
    mine = client.get("/api/v1/decisions", headers=vision, params={"limit": 1}).json()[0]
    assert not re.search(r"\bnlp\b", str(mine))
    assert any("for team vision" in line for line in mine["reasons"]), mine["reasons"]
    theirs = client.get(f"/api/v1/decisions/{full['id']}", headers=nlp).json()
    assert not re.search(r"\bvision\b", str(theirs))  # ("revision" is not the team)
    assert any("hold 1 task(s)" in line and "team nlp" in line for line in theirs["reasons"]), theirs["reasons"]
