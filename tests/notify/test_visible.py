"""Delivery status is visible: `GET /api/v1/alerts` (scoped to the viewer's team),
`autoscaler alerts` and `autoscaler alerts test --channel NAME`, the dashboard's
overview, and `autoscaler_alert_deliveries` in `/metrics`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.notify.deliver import deliver_pending
from autoscaler.notify.due import Due, record
from autoscaler.state.db import transaction
from tests.conftest import TEST_CONFIG, LiveServer, issue_token, make_context
from tests.notify.receivers import HttpReceiver
from tests.test_cli import cli

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)


@pytest.fixture
def setup(sessions: sessionmaker[Session]) -> Iterator[tuple[LiveServer, HttpReceiver, str]]:
    hook = HttpReceiver(secret="k").start()
    text = TEST_CONFIG + (
        "notifications:\n  channels:\n"
        f"    - {{name: hook, type: webhook, url: '{hook.url}', secret: k}}\n"
        "    - {name: down, type: slack, url: 'http://127.0.0.1:9/nothing-listens'}\n"
    )
    config = parse_config(text, Path("t.yaml"))
    ctx = make_context(config, sessions, ManualClock(NOW))
    with transaction(sessions) as s:
        record(
            s,
            [
                Due(
                    "budget/vision/2026-03/actual/80",
                    "budget",
                    "warning",
                    "vision has spent 81%",
                    team="vision",
                    period="2026-03",
                    threshold_pct=80,
                    basis="actual",
                ),
                Due(
                    "budget/nlp/2026-03/actual/50",
                    "budget",
                    "info",
                    "nlp has spent 50%",
                    team="nlp",
                    period="2026-03",
                    threshold_pct=50,
                    basis="actual",
                ),
                Due("fail_safe/20260310T120000Z", "fail_safe", "critical", "policy fail-safe in force"),
            ],
            now=NOW,
            config=config.notifications,
        )
    deliver_pending(sessions, config, ctx.clock)
    server = LiveServer(ctx).start()
    admin = issue_token(ctx, "admin")
    yield server, hook, admin
    server.stop()
    hook.stop()


def test_api_and_cli_show_each_channel_status_for_the_viewer(setup: tuple[LiveServer, HttpReceiver, str]) -> None:
    server, hook, admin = setup
    assert len(hook.received) == 3
    got = httpx.get(f"{server.url}/api/v1/alerts", headers={"Authorization": f"Bearer {admin}"}, timeout=10).json()
    assert [c["name"] for c in got["channels"]] == ["hook", "down"]
    assert [a["kind"] for a in got["alerts"]] == ["fail_safe", "budget", "budget"]
    for a in got["alerts"]:
        status = {d["channel"]: (d["status"], d["attempts"]) for d in a["deliveries"]}
        assert status == {"hook": ("delivered", 1), "down": ("pending", 1)}
        assert "ConnectError" in next(d["last_error"] for d in a["deliveries"] if d["channel"] == "down")

    vision = issue_token(server.ctx, "team", team="vision")
    mine = httpx.get(f"{server.url}/api/v1/alerts", headers={"Authorization": f"Bearer {vision}"}, timeout=10)
    assert [a["team"] for a in mine.json()["alerts"]] == ["vision"]
    other = httpx.get(
        f"{server.url}/api/v1/alerts", params={"team": "nlp"}, headers={"Authorization": f"Bearer {vision}"}, timeout=10
    )
    assert other.status_code == 403

    table = cli("alerts", "--server", server.url, "--token", admin)
    assert table.returncode == 0, table.stderr
    assert "vision has spent 81%" in table.stdout and "hook: delivered" in table.stdout
    assert "down: pending after 1 attempt(s)" in table.stdout and "ConnectError" in table.stdout
    as_json = cli("alerts", "--json", "--team", "nlp", "--server", server.url, "--token", admin)
    assert [a["key"] for a in json.loads(as_json.stdout)["alerts"]] == ["budget/nlp/2026-03/actual/50"]


def test_cli_sends_a_test_message_and_reports_a_failure(setup: tuple[LiveServer, HttpReceiver, str]) -> None:
    server, hook, admin = setup
    ok = cli("alerts", "test", "--channel", "hook", "--server", server.url, "--token", admin)
    assert ok.returncode == 0, ok.stderr
    assert "test message delivered to channel hook (webhook)" in ok.stdout
    assert hook.received[-1].json["test"] is True
    bad = cli("alerts", "test", "--channel", "down", "--server", server.url, "--token", admin)
    assert bad.returncode == 1 and "not delivered" in bad.stderr and "ConnectError" in bad.stderr
    unknown = cli("alerts", "test", "--channel", "nope", "--server", server.url, "--token", admin)
    assert unknown.returncode == 1 and "no channel named 'nope'" in unknown.stderr
    team = issue_token(server.ctx, "team", team="vision")
    refused = cli("alerts", "test", "--channel", "hook", "--server", server.url, "--token", team)
    assert refused.returncode == 1


def test_dashboard_and_metrics_show_delivery_status(setup: tuple[LiveServer, HttpReceiver, str]) -> None:
    server, _, admin = setup
    http = httpx.Client(base_url=server.url, timeout=10)
    assert http.post("/login", data={"token": admin, "next": "/"}).status_code == 303
    page = http.get("/").text
    assert 'id="alerts"' in page and "vision has spent 81%" in page and "policy fail-safe in force" in page
    assert 'class="delivery delivered"' in page and "down: pending (1 attempt)" in page

    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {admin}"}, timeout=10).text
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "autoscaler_alert_deliveries"]
    values = {(s.labels["channel"], s.labels["status"]): s.value for s in family.samples}
    assert values == {("hook", "delivered"): 3, ("down", "pending"): 3}
