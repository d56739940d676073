"""`/metrics`: parses with prometheus_client's own parser, moves when tasks move,
and shows a team token only its own team's series."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from autoscaler import metrics
from autoscaler.config import AutoscalerConfig
from tests.conftest import LiveServer, issue_token
from tests.web.helpers import Agent, add_instance, add_spend, budget_config, enqueue


@pytest.fixture
def config(tmp_path: Path) -> AutoscalerConfig:
    return budget_config(tmp_path / "policies", {"vision": 100.0, "nlp": 1000.0})


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, token: str | None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(f"{url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def test_metrics_move_with_tasks_and_spend(live_server: LiveServer, admin_token: str) -> None:
    ctx, url = live_server.ctx, live_server.url
    vision = issue_token(ctx, "team", team="vision")
    first = enqueue(url, vision, ["a"])
    enqueue(url, vision, ["b"])
    before = scrape(url, admin_token)
    assert value(before, "autoscaler_queue_depth", queue="gpu") == 2
    assert value(before, "autoscaler_queue_running", queue="gpu") == 0
    assert value(before, "autoscaler_tasks", team="vision", state="queued") == 2
    assert value(before, "autoscaler_task_leases_total") == 0
    assert (value(before, "autoscaler_queue_oldest_wait_seconds", queue="gpu") or 0) >= 0

    agent = Agent(url, admin_token)
    assert agent.lease()["id"] == first["id"]
    agent.start(first["id"])
    add_instance(ctx, team="vision", now=ctx.clock.now(), price=2.0)
    now = ctx.clock.now()
    add_spend(
        ctx,
        team="vision",
        start=now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
        hours=1,
        price=90.0,
    )
    after = scrape(url, admin_token)
    assert value(after, "autoscaler_queue_depth", queue="gpu") == 1
    assert value(after, "autoscaler_queue_running", queue="gpu") == 1
    assert value(after, "autoscaler_tasks", team="vision", state="running") == 1
    assert value(after, "autoscaler_task_leases_total") == 1
    assert value(after, "autoscaler_workers", pool="gpu-pool", state="busy") == 1
    assert (
        value(
            after,
            "autoscaler_instances",
            provider="fake",
            pool="gpu-pool",
            capacity_type="spot",
            state="ready",
        )
        == 1
    )
    assert value(after, "autoscaler_team_spend_usd", team="vision") == pytest.approx(90.0)
    assert value(after, "autoscaler_team_budget_usd", team="vision") == 100.0
    assert value(after, "autoscaler_team_budget_ratio", team="vision") == pytest.approx(0.9)
    assert value(after, "autoscaler_team_burn_usd_per_hour", team="vision") == 2.0
    assert (value(after, "autoscaler_team_spend_forecast_usd", team="vision") or 0) > 90.0
    agent.close()


def test_in_process_instruments_reach_admin_scrapes(live_server: LiveServer, admin_token: str) -> None:
    url = live_server.url
    before = scrape(url, admin_token)
    metrics.observe_cycle(0.3)
    metrics.policy_eval(0.002, ok=True)
    metrics.policy_eval(0.004, ok=False)
    metrics.provider_error("aws", "InsufficientCapacity")
    after = scrape(url, admin_token)

    def delta(name: str, **labels: str) -> float:
        return (value(after, name, **labels) or 0.0) - (value(before, name, **labels) or 0.0)

    assert delta("autoscaler_reconcile_cycle_seconds_count") == 1
    assert delta("autoscaler_reconcile_cycle_seconds_bucket", le="0.5") == 1
    assert delta("autoscaler_policy_evaluation_seconds_count") == 2
    assert delta("autoscaler_policy_evaluation_failures_total") == 1
    assert delta("autoscaler_provider_errors_total", provider="aws", kind="InsufficientCapacity") == 1


def test_team_token_sees_only_its_team(live_server: LiveServer, admin_token: str) -> None:
    ctx, url = live_server.ctx, live_server.url
    vision, nlp = issue_token(ctx, "team", team="vision"), issue_token(ctx, "team", team="nlp")
    enqueue(url, vision, ["a"])
    enqueue(url, nlp, ["b"])
    enqueue(url, nlp, ["c"])
    add_instance(ctx, team="nlp", now=ctx.clock.now())
    mine = scrape(url, vision)
    assert value(mine, "autoscaler_queue_depth", queue="gpu") == 1, "a team counts only its own tasks"
    assert value(mine, "autoscaler_tasks", team="vision", state="queued") == 1
    labels = {v for (_name, pairs) in mine for _k, v in pairs}
    assert "nlp" not in labels
    assert not any(name.startswith("autoscaler_instances") for name, _ in mine)
    assert not any(
        name.startswith(("autoscaler_reconcile", "autoscaler_provider", "autoscaler_workers")) for name, _ in mine
    )
    assert value(scrape(url, admin_token), "autoscaler_queue_depth", queue="gpu") == 3


def test_metrics_need_a_token(live_server: LiveServer) -> None:
    response = httpx.get(f"{live_server.url}/metrics", timeout=10)
    assert response.status_code == 401
    assert "token" in response.json()["detail"]
