"""Dashboard pages over plain HTTP: login cookie attributes, errors as pages (never
500), and the decisions, charts and fleet pages rendering recorded state for the
right viewer. The browser flow itself is in test_dashboard_browser.py."""

from __future__ import annotations

from datetime import timedelta

import httpx

from autoscaler.admission import store as admission_store
from autoscaler.admission.model import admissions
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.queueing import tasks as task_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import DecisionRecord, HistoryPoint, Instance, InstanceEvent
from tests.conftest import LiveServer, issue_token
from tests.web.helpers import Agent, add_instance


def _session(url: str, token: str) -> httpx.Client:
    http = httpx.Client(base_url=url, timeout=10)
    response = http.post("/login", data={"token": token, "next": "/fleet"})
    assert response.status_code == 303 and response.headers["location"] == "/fleet"
    cookie = response.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
    return http


def test_login_errors_and_redirects(live_server: LiveServer, admin_token: str) -> None:
    url = live_server.url
    anonymous = httpx.get(f"{url}/fleet?all=1", timeout=10)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login?next=%2Ffleet%3Fall%3D1"
    bad = httpx.post(f"{url}/login", data={"token": "ast_wrong"}, timeout=10)
    assert bad.status_code == 401 and "invalid or expired token" in bad.text and "set-cookie" not in bad.headers
    worker_kind = issue_token(live_server.ctx, "join", pool="gpu-pool")
    refused = httpx.post(f"{url}/login", data={"token": worker_kind}, timeout=10)
    assert refused.status_code == 403 and "admin or a team token" in refused.text
    open_redirect = httpx.post(f"{url}/login", data={"token": admin_token, "next": "//evil.example/"}, timeout=10)
    assert open_redirect.headers["location"] == "/"
    http = _session(url, admin_token)
    assert http.get("/tasks?state=bogus").status_code == 422
    assert "unknown state &#39;bogus&#39;" in http.get("/tasks?state=bogus").text
    # An admin's team filter names a team of this deployment, as in the API and CLI (it showed an empty list).
    unknown_team = http.get("/tasks?team=visoin")
    assert (
        unknown_team.status_code == 422
        and "unknown team &#39;visoin&#39; (known: default, vision, nlp)" in unknown_team.text
    )
    assert http.get("/tasks?team=vision").status_code == 200
    unknown_queue = http.get("/tasks?queue=gpuu")  # and a queue filter naming no queue
    assert (
        unknown_queue.status_code == 404
        and "queue &#39;gpuu&#39; does not exist (known: gpu, cpu, vision-only)" in (unknown_queue.text)
    )
    assert http.get("/tasks?queue=vision-only").status_code == 200
    assert http.get("/decisions?limit=0").status_code == 422
    assert http.get("/charts?hours=x").status_code == 422
    assert http.get("/tasks/" + "z" * 300).status_code == 404
    page = http.get("/")
    assert page.status_code == 200 and page.headers["cache-control"] == "no-store"
    assert "script-src 'none'" in page.headers["content-security-policy"]
    logout = http.post("/logout")
    assert logout.status_code == 303 and 'autoscaler_session=""' in logout.headers["set-cookie"]


def test_decisions_charts_and_fleet_render_for_the_right_viewer(live_server: LiveServer, admin_token: str) -> None:
    ctx, url = live_server.ctx, live_server.url
    now = ctx.clock.now()
    agent = Agent(url, admin_token, instance_id="i-vision-vm")
    add_instance(ctx, team="vision", now=now, provider_instance_id="i-vision-vm", price=1.5)
    add_instance(ctx, team="nlp", now=now, provider_instance_id="i-nlp-vm")
    with transaction(ctx.sessions) as s:
        s.add(
            DecisionRecord(
                at=now,
                policy_revision="rev-abc123",
                cycle_ms=12.0,
                eval_ms=0.4,
                reasons=[
                    "queue gpu: 2 tasks wait for 1xA10G; launching g.1 spot (cheapest that fits)",
                    {"team": "nlp", "message": "nlp at 85 % of budget"},
                ],
                plan={"launch": [{"pool": "gpu-pool"}], "drain": []},
                result={"teams": {"vision": {"may_scale_up": False, "reasons": ["vision forecast over budget"]}}},
            )
        )
        for i in range(5):
            at = now - timedelta(minutes=10 - i)
            s.add(HistoryPoint(at=at, metric="queue_depth", key="gpu", value=float(i)))
            s.add(HistoryPoint(at=at, metric="spend_mtd_usd", key="vision", value=10.0 + i))
            s.add(HistoryPoint(at=at, metric="spend_mtd_usd", key="nlp", value=20.0 + i))
            s.add(HistoryPoint(at=at, metric="worker_gpu_utilization_pct", key=agent.id, value=20.0 * i))

    admin = _session(url, admin_token)
    decisions = admin.get("/decisions").text
    assert "rev-abc123" in decisions and "launching g.1 spot (cheapest that fits)" in decisions
    assert "launch 1" in decisions and "nlp: nlp at 85 % of budget" in decisions
    charts = admin.get("/charts").text
    assert charts.count('<svg class="chart"') == 2 and "Queue depth" in charts and "polyline" in charts
    fleet = admin.get("/fleet").text
    assert "i-vision-vm" in fleet and "i-nlp-vm" in fleet and 'class="spark"' in fleet and "80 %" in fleet

    vision = _session(url, issue_token(ctx, "team", team="vision"))
    decisions = vision.get("/decisions").text
    assert "rev-abc123" in decisions and "may not grow" in decisions and "vision forecast over budget" in decisions
    assert "cheapest that fits" not in decisions and "nlp" not in decisions
    charts = vision.get("/charts").text
    assert charts.count('<svg class="chart"') == 1 and "Queue depth" not in charts and "nlp" not in charts
    fleet = vision.get("/fleet").text
    assert "i-vision-vm" in fleet and "i-nlp-vm" not in fleet and "≈$3.00" in fleet
    agent.close()


def test_frozen_team_page_says_so_and_task_page_says_why(live_server: LiveServer) -> None:
    ctx, url = live_server.ctx, live_server.url
    now = ctx.clock.now()
    with transaction(ctx.sessions) as s:
        # The recorded decision let vision grow, with headroom; the admission the
        # gates enforce now has that headroom used up.
        s.add(
            DecisionRecord(
                at=now,
                policy_revision="rev-1",
                cycle_ms=1.0,
                eval_ms=0.1,
                reasons=[],
                plan={},
                result={"teams": {"vision": {"may_scale_up": True, "spend_headroom_per_hour": 0.5, "reasons": []}}},
            )
        )
        decision = Decision(teams={"vision": TeamDecision(spend_headroom_per_hour=0.0, reasons=["vision at 99 %"])})
        admission_store.write(s, admissions(decision, {}), now=now)
        spec = task_ops.TaskSpec(queue="gpu", command=["true"], gpus=1)
        task_id = task_ops.enqueue(s, spec, team="vision", now=now).id
    vision = _session(url, issue_token(ctx, "team", team="vision"))
    page = vision.get("/decisions").text
    assert "may grow" not in page and "may not grow: spend headroom used up" in page and "vision at 99 %" in page
    task_page = vision.get(f"/tasks/{task_id}").text
    assert 'id="task-why" data-code="budget"' in task_page and "held by its team&#39;s budget" in task_page


def test_task_page_lists_artifacts_with_sizes_and_digests_for_its_team_only(live_server: LiveServer) -> None:
    from autoscaler.artifacts import records
    from autoscaler.artifacts.store import Written

    ctx, url = live_server.ctx, live_server.url
    now = ctx.clock.now()
    with transaction(ctx.sessions) as s:
        spec = task_ops.TaskSpec(queue="gpu", command=["true"], outputs=["out/m.pt"], checkpoint_dir="ckpt")
        task_id = task_ops.enqueue(s, spec, team="vision", now=now).id
        digest = "sha256:" + "c" * 64
        records.record_artifact(
            s, task_id=task_id, team="vision", attempt=1, kind="output", name="out/m.pt",
            key=records.artifact_key(task_id, 1, "output", "out/m.pt"), written=Written(1234, digest), now=now,
        )  # fmt: skip
    page = _session(url, issue_token(ctx, "team", team="vision")).get(f"/tasks/{task_id}").text
    assert 'id="task-artifacts"' in page and "out/m.pt" in page and "1234" in page and digest in page
    assert "ckpt" in page
    other = _session(url, issue_token(ctx, "team", team="nlp")).get(f"/tasks/{task_id}")
    assert other.status_code == 404 and digest not in other.text


def test_the_fleet_page_shows_observed_reclaim_rates(live_server: LiveServer, admin_token: str) -> None:
    ctx, url = live_server.ctx, live_server.url
    now = ctx.clock.now()
    http = _session(url, admin_token)
    assert "no spot instance observed yet" in http.get("/fleet").text
    inst = add_instance(ctx, team="vision", now=now, state="terminated")
    with transaction(ctx.sessions) as s:
        row = s.get(Instance, inst)
        assert row is not None
        row.launched_at, row.terminated_at = now - timedelta(hours=2), now
        s.add(InstanceEvent(instance_id=inst, at=now, from_state="ready", to_state="preempted", reason="spot"))
    page = http.get("/fleet").text
    assert 'data-offering="spot/g.1/-"' in page
    # (0.24 x 20 + 1) / (20 + 2) = 0.264, from 2 instance-hours and 1 reclaim.
    row_html = page.split('data-offering="spot/g.1/-"', 1)[1].split("</tr>", 1)[0]
    assert "0.264" in row_html and "2.0" in row_html and "1.0" in row_html
    # A team sees it too: a fleet figure naming no team.
    vision = _session(url, issue_token(ctx, "team", team="vision"))
    assert 'data-offering="spot/g.1/-"' in vision.get("/fleet").text
