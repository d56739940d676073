"""Spend reports: the FOCUS CSV export round-trips and sums to the ledger's total for
the month; `autoscaler spend` renders table/JSON/CSV; `autoscaler top` shows one frame."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
from typer.testing import CliRunner

from autoscaler.cli import _register, app
from autoscaler.ledger.spend import month_to_date
from autoscaler.reports.focus import COLUMNS, from_csv, total
from autoscaler.reports.period import month_bounds
from autoscaler.reports.spend import spend_lines
from autoscaler.state.db import transaction
from tests.conftest import LiveServer, issue_token
from tests.web.helpers import add_instance, add_spend, enqueue

MARCH = datetime(2026, 3, 1, tzinfo=UTC)
runner = CliRunner()
_register()


def _ledger_rows(live_server: LiveServer) -> None:
    ctx = live_server.ctx
    add_spend(ctx, team="vision", start=datetime(2026, 2, 27, tzinfo=UTC), hours=5, price=3.0)  # February
    add_spend(ctx, team="vision", start=datetime(2026, 3, 2, tzinfo=UTC), hours=10, price=1.25, instance_id="i-a")
    add_spend(ctx, team="vision", start=datetime(2026, 3, 5, tzinfo=UTC), hours=2.5, price=0.4, instance_id="i-b")
    add_spend(
        ctx,
        team="nlp",
        start=datetime(2026, 3, 9, tzinfo=UTC),
        hours=7,
        price=2.0,
        instance_id="i-c",
        capacity_type="on_demand",
    )


def _ledger_total(live_server: LiveServer, team: str | None = None) -> float:
    """The ledger's own month-to-date total for March (all teams, or one)."""
    with transaction(live_server.ctx.sessions) as s:
        return sum(month_to_date(s, MARCH, team=team).values())


def test_focus_csv_round_trips_and_sums_to_the_ledger(live_server: LiveServer, admin_token: str) -> None:
    _ledger_rows(live_server)
    response = httpx.get(
        f"{live_server.url}/api/v1/reports/spend",
        params={"month": "2026-03", "format": "csv"},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert response.text.splitlines()[0].split(",") == COLUMNS
    rows = from_csv(response.text)
    assert len(rows) == 3
    assert total(rows) == 12.5 + 1.0 + 14.0 == _ledger_total(live_server)
    by_resource = {r["ResourceId"]: r for r in rows}
    assert by_resource["i-c"]["PricingCategory"] == "Standard" and by_resource["i-a"]["PricingCategory"] == "Dynamic"
    assert by_resource["i-a"]["ConsumedQuantity"] == 10.0 and by_resource["i-a"]["ListUnitPrice"] == 1.25
    assert by_resource["i-a"]["ChargePeriodStart"] == "2026-03-02T00:00:00+00:00"
    assert by_resource["i-a"]["ChargePeriodEnd"] == "2026-03-02T10:00:00+00:00"
    assert json.loads(by_resource["i-c"]["Tags"]) == {"team": "nlp", "pool": "gpu-pool"}
    assert (by_resource["i-c"]["x_Team"], by_resource["i-c"]["x_Pool"]) == ("nlp", "gpu-pool")
    assert all(r["BilledCost"] == r["EffectiveCost"] for r in rows)


def test_team_token_exports_only_its_team(live_server: LiveServer) -> None:
    _ledger_rows(live_server)
    nlp = issue_token(live_server.ctx, "team", team="nlp")
    body = httpx.get(
        f"{live_server.url}/api/v1/reports/spend",
        params={"month": "2026-03", "team": "vision"},
        headers={"Authorization": f"Bearer {nlp}"},
        timeout=10,
    ).json()
    assert {r["x_Team"] for r in body["rows"]} == {"nlp"}
    assert body["total_usd"] == _ledger_total(live_server, "nlp") == 14.0


def test_segment_straddling_months_is_prorated(live_server: LiveServer) -> None:
    # 10 h from Mar 31 20:00 to Apr 1 06:00: 4 h in March, 6 h in April.
    add_spend(live_server.ctx, team="vision", start=datetime(2026, 3, 31, 20, tzinfo=UTC), hours=10, price=1.0)
    with transaction(live_server.ctx.sessions) as s:
        march = spend_lines(s, *month_bounds("2026-03"))
        april = spend_lines(s, *month_bounds("2026-04"))
    assert [round(x.cost_usd, 9) for x in march] == [4.0] and [round(x.cost_usd, 9) for x in april] == [6.0]
    assert march[0].end == datetime(2026, 4, 1, tzinfo=UTC) == april[0].start


def test_spend_cli_formats_and_errors(live_server: LiveServer, admin_token: str) -> None:
    _ledger_rows(live_server)
    base = ["--server", live_server.url, "--token", admin_token]
    csv_run = runner.invoke(app, ["spend", "--month", "2026-03", "--format", "csv", *base])
    assert csv_run.exit_code == 0, csv_run.output
    assert total(from_csv(csv_run.output)) == _ledger_total(live_server)
    json_run = runner.invoke(app, ["spend", "--month", "2026-03", "--format", "json", *base])
    assert json.loads(json_run.output)["total_usd"] == 27.5
    table_run = runner.invoke(app, ["spend", "--month", "2026-03", *base])
    assert table_run.exit_code == 0 and "total" in table_run.output and "27.50" in table_run.output
    bad = runner.invoke(app, ["spend", "--month", "2026-13", *base])
    assert bad.exit_code != 0 and "YYYY-MM" in str(bad.exception)
    server_side = httpx.get(
        f"{live_server.url}/api/v1/reports/spend",
        params={"month": "March"},
        headers={"Authorization": f"Bearer {admin_token}"},
        timeout=10,
    )
    assert server_side.status_code == 422 and "YYYY-MM" in server_side.json()["detail"]


def test_top_once_shows_queues_and_fleet(live_server: LiveServer, admin_token: str) -> None:
    ctx = live_server.ctx
    enqueue(live_server.url, issue_token(ctx, "team", team="vision"), ["x"])
    add_instance(ctx, team="vision", now=ctx.clock.now(), price=0.4)
    result = runner.invoke(app, ["top", "--once", "--server", live_server.url, "--token", admin_token])
    assert result.exit_code == 0, result.output
    gpu_row = next(line for line in result.output.splitlines() if " gpu " in f" {line} " and "│" in line)
    assert "1" in gpu_row
    assert "gpu-pool" in result.output and "ready" in result.output and "0.40" in result.output
