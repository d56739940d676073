"""Spend reports: the FOCUS CSV export round-trips and sums to the ledger's total for
the month; `autoscaler spend` renders table/JSON/CSV; `autoscaler top` shows one frame."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

from autoscaler.cli import _register, app
from autoscaler.config import load_config, parse_config
from autoscaler.ledger.spend import accrue, month_to_date
from autoscaler.reports.focus import COLUMNS, focus_row, from_csv, total
from autoscaler.reports.spend import spend_lines
from autoscaler.state.db import transaction
from tests.conftest import TEST_CONFIG, LiveServer, issue_token
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
    assert by_resource["i-a"]["ConsumedQuantity"] == 10.0 == by_resource["i-a"]["PricingQuantity"]
    # Contracted = the price the ledger recorded; list = the pool's on-demand price for g.1.
    assert (by_resource["i-a"]["ContractedUnitPrice"], by_resource["i-a"]["ContractedCost"]) == (1.25, 12.5)
    assert (by_resource["i-a"]["ListUnitPrice"], by_resource["i-a"]["ListCost"]) == (1.0, 10.0)
    assert by_resource["i-a"]["BillingAccountId"] == "test" and by_resource["i-c"]["SubAccountId"] == "nlp"
    assert by_resource["i-a"]["BillingPeriodStart"] == "2026-03-01T00:00:00Z"
    assert by_resource["i-a"]["BillingPeriodEnd"] == "2026-04-01T00:00:00Z"
    assert by_resource["i-a"]["ServiceName"] == "GPU autoscaler compute" and by_resource["i-a"]["ChargeClass"] is None
    assert by_resource["i-a"]["ChargePeriodStart"] == "2026-03-02T00:00:00Z"
    assert by_resource["i-a"]["ChargePeriodEnd"] == "2026-03-02T10:00:00Z"
    assert json.loads(by_resource["i-c"]["Tags"]) == {"team": "nlp", "pool": "gpu-pool", "cost_kind": "unused"}
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


def test_ledger_splits_at_month_end_and_each_export_sums_to_its_month(live_server: LiveServer) -> None:
    # The ledger cuts segments at month boundaries (the export no longer pro-rates):
    # 10 h from Mar 31 20:00 to Apr 1 06:00 are 4 h in March and 6 h in April.
    ctx = live_server.ctx
    add_instance(ctx, team="vision", now=datetime(2026, 3, 31, 22, tzinfo=UTC), price=1.0)
    with transaction(ctx.sessions) as s:
        accrue(s, now=datetime(2026, 4, 1, 6, tzinfo=UTC))
    with transaction(ctx.sessions) as s:
        march = [focus_row(x) for x in spend_lines(s, "2026-03")]
        april = [focus_row(x) for x in spend_lines(s, "2026-04")]
        march_total = sum(month_to_date(s, MARCH).values())
        april_total = sum(month_to_date(s, datetime(2026, 4, 1, tzinfo=UTC)).values())
    assert [r["BilledCost"] for r in march] == [4.0] and [r["BilledCost"] for r in april] == [6.0]
    assert total(march) == march_total and total(april) == april_total
    assert march[0]["ChargePeriodEnd"] == "2026-04-01T00:00:00Z" == april[0]["ChargePeriodStart"]
    assert march[0]["ConsumedQuantity"] == 4.0 and march[0]["x_CostKind"] == "unused"


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


def test_budgets_shown_are_this_deployments_teams_only(tmp_path: Path) -> None:
    """The shipped policy data names no team (the demo teams research, interns and
    prod-inference are the policy tests' fixtures); a deployment that declares vision and
    nlp sees only those, from its own data (issue 23 item 8)."""
    from autoscaler.reports.budgets import load_budgets, policy_dir, team_budgets
    from tests.web.helpers import budget_config

    shipped = parse_config(TEST_CONFIG, Path("test.yaml"))  # policy.dir unset: the shipped policies
    assert load_budgets(policy_dir(shipped)) == {}
    assert team_budgets(shipped) == {}  # no default budget there, and neither team is listed
    fixtures = policy_dir(shipped) / "tests" / "fixtures"
    assert {"research", "interns", "prod-inference"} <= set(load_budgets(policy_dir(shipped), fixtures))  # control
    example = load_config(Path(__file__).resolve().parents[1] / "examples" / "local.yaml")
    assert team_budgets(example) == {"vision": 20000.0, "nlp": 5000.0}  # from examples/policy-data
    doc = {"default": {"monthly_usd": 50}, "teams": {"vision": {"monthly_usd": 100}, "ghost": {"monthly_usd": 9}}}
    config = budget_config(tmp_path / "p", {})
    (tmp_path / "p" / "data" / "budgets.yaml").write_text(yaml.safe_dump(doc))
    assert team_budgets(config) == {"vision": 100.0, "nlp": 50.0}
