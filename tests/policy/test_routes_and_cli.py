"""The policy endpoints over the real app, and the `autoscaler policy` commands."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from autoscaler.api.app import create_app
from autoscaler.cli import _register, app
from autoscaler.config import PolicyConfig
from autoscaler.policy.schema import export_schemas
from autoscaler.policy.service import PolicyService
from tests.conftest import issue_token
from tests.policy.helpers import DEMO_DATA, NOW, copy_policies, write_module

_register()
runner = CliRunner()


@pytest.fixture
def served(ctx, tmp_path):
    directory = copy_policies(tmp_path)
    service = PolicyService(PolicyConfig(dir=str(directory), timeout_s=10), clock=ctx.clock, isolate=False)
    ctx.policy = service
    client = TestClient(create_app(ctx))
    yield client, service, directory
    service.close()


def test_status_for_users_reload_for_admins(ctx, served):
    client, service, directory = served
    admin = {"Authorization": f"Bearer {issue_token(ctx, 'admin')}"}
    team = {"Authorization": f"Bearer {issue_token(ctx, 'team', team='vision')}"}
    r = client.get("/api/v1/policy", headers=team)
    assert r.status_code == 200 and r.json()["revision"] == service.revision
    assert r.json()["test_cases_passed"] >= 30
    assert client.get("/api/v1/policy").status_code == 401
    r = client.post("/api/v1/policy/reload", headers=team)
    assert r.status_code == 403 and "admin" in r.json()["detail"]

    good = service.revision
    write_module(directory, "extra.rego", "package autoscaler.extra\n\nimport rego.v1\n\nx := := 1\n")
    r = client.post("/api/v1/policy/reload", headers=admin)
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] is False and body["revision"] == good and "extra.rego:5" in body["message"]
    assert client.get("/api/v1/policy", headers=admin).json()["last_reload_error"] == body["message"]

    (directory / "extra.rego").unlink()
    r = client.post("/api/v1/policy/reload", headers=admin)
    assert r.json()["ok"] is True and r.json()["revision"] == good
    assert client.get("/api/v1/policy", headers=admin).json()["last_reload_error"] is None


def test_endpoints_say_so_when_the_service_is_not_running(ctx):
    assert ctx.policy is None  # what `autoscaler server` runs: no policy service
    client = TestClient(create_app(ctx))
    r = client.get("/api/v1/policy", headers={"Authorization": f"Bearer {issue_token(ctx, 'admin')}"})
    assert r.status_code == 404 and "not running" in r.json()["detail"]


def test_cli_check_and_test_pass_on_the_shipped_policies(tmp_path):
    directory = copy_policies(tmp_path)
    r = runner.invoke(app, ["policy", "check", str(directory)])
    assert r.exit_code == 0 and "ok: 5 module(s)" in r.output
    r = runner.invoke(app, ["policy", "test", str(directory)])
    assert r.exit_code == 0, r.output
    assert r.output.count("PASS ") >= 30 and "FAIL" not in r.output


def test_cli_test_prints_the_failing_case_and_exits_non_zero(tmp_path):
    directory = copy_policies(tmp_path)
    budgets = directory / "tests" / "fixtures" / "budgets.yaml"  # the data the cases run on
    budgets.write_text(budgets.read_text().replace("kind: hard\n  prod", "kind: soft\n  prod", 1))
    r = runner.invoke(app, ["policy", "test", str(directory)])
    assert r.exit_code != 0
    assert "FAIL tests/budgets.yaml: hard budget spent - drain the team's capacity" in r.output
    assert "decision.teams.research.drain: expected True, got False" in r.output


CASE = '{name: mine, input: {now: "2026-03-16T00:00:00Z"}, expect: {teams: {}}'


@pytest.mark.parametrize(
    "text,needle",
    [
        # Each of these used to be dropped in silence, and the case passed without checking it.
        ("cases: [" + CASE + ", absnt: [pools.aws-a100]}]", "case #1: unknown key `absnt` (did you mean `absent`?)"),
        ("cases: [" + CASE + ", tolerence: 0.01}]", "case #1: unknown key `tolerence` (did you mean `tolerance`?)"),
        ("dat: {budgets: {}}\ncases: [" + CASE + "}]", "tests/mine.yaml:1: unknown key `dat` (did you mean `data`?)"),
        ('cases: [{name: mine, input: {now: "2026-03-16T00:00:00Z"}, expect: true}]', "`expect` must be a mapping"),
        ("cases: [" + CASE + ", absent: pools.aws-a100}]", "`absent` must be a list of decision paths"),
    ],
)
def test_cli_test_refuses_a_case_it_would_not_check(tmp_path, text, needle):
    directory = copy_policies(tmp_path)
    (directory / "tests" / "mine.yaml").write_text(text + "\n")
    r = runner.invoke(app, ["policy", "test", str(directory)])
    assert r.exit_code != 0 and "PASS tests/mine.yaml" not in r.output
    assert needle in r.output + str(r.exception), r.output


def test_cli_check_reports_file_and_line(tmp_path):
    directory = copy_policies(tmp_path)
    write_module(directory, "extra.rego", "package autoscaler.extra\n\nimport rego.v1\n\nx := 1 { input.now }\n")
    r = runner.invoke(app, ["policy", "check", str(directory)])
    assert r.exit_code != 0 and "extra.rego:5:8: `if` keyword is required before rule body" in r.output


def test_cli_eval_prints_the_decision(tmp_path):
    path = tmp_path / "input.yaml"
    path.write_text(json.dumps({"now": NOW, "teams": [{"name": "interns", "running_gpus": 1}]}))
    r = runner.invoke(app, ["policy", "eval", "--input", str(path), "--data-dir", str(DEMO_DATA)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["decision"]["teams"]["interns"]["allowed_capacity_types"] == ["spot"]
    # Without the demo data no team is spot-only.
    r = runner.invoke(app, ["policy", "eval", "--input", str(path)])
    assert json.loads(r.output)["decision"]["teams"]["interns"]["allowed_capacity_types"] == ["spot", "on_demand"]
    assert len(out["revision"]) == 16 and len(out["input_digest"]) == 32


def test_cli_eval_refuses_a_bad_input_with_one_line(tmp_path):
    path = tmp_path / "input.yaml"
    path.write_text(json.dumps({"now": NOW, "teams": [{"name": "x", "month_to_date_usd": -5}]}))
    r = runner.invoke(app, ["policy", "eval", "--input", str(path)])
    assert r.exit_code != 0
    assert "invalid policy input at teams.0.month_to_date_usd" in str(r.exception)


def test_exported_schemas_are_up_to_date():
    from autoscaler.policy.bundle import shipped_policy_dir

    docs = shipped_policy_dir().parent / "docs" / "schemas"
    for name, schema in export_schemas().items():
        assert json.loads((docs / name).read_text()) == schema, f"run: autoscaler policy schema (stale {name})"
