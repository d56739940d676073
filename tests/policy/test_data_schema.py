"""The policy data files have a schema: a typo or a wrong kind of value is refused with
the file, the line, the key path and what was expected, instead of silently reading
as "no budget" (docs/policies.md, "What the data files may hold")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY
from pydantic import ValidationError
from typer.testing import CliRunner

from autoscaler.cli import _register, app
from autoscaler.config import PolicyConfig
from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import complete_input
from autoscaler.policy.data_schema import SHIPPED
from autoscaler.policy.problems import PolicyError
from autoscaler.policy.service import PolicyService
from tests.policy.helpers import NOW, copy_policies

_register()
runner = CliRunner()

RESEARCH = "  research:\n    monthly_usd: 20000\n    kind: hard\n"
INTERNS_Q = "quota: {nominal_gpus: 4, borrowing_limit_gpus: 4}"

# name: (data file, text replaced, replacement, the problem expected: file[:line]: path: what)
BAD: dict[str, tuple[str, str, str, str]] = {
    "monthy_usd (typo in a key)": (
        "budgets",
        RESEARCH,
        "  research:\n    monthy_usd: 20000\n    kind: hard\n",
        "data/budgets.yaml:23: teams.research.monthy_usd: unknown key (did you mean monthly_usd?)",
    ),
    "kind: hardd": (
        "budgets",
        RESEARCH,
        RESEARCH.replace("kind: hard", "kind: hardd"),
        "data/budgets.yaml:24: teams.research.kind: 'hardd' is not one of hard, soft",
    ),
    'monthly_usd: "5k"': (
        "budgets",
        "monthly_usd: 20000",
        'monthly_usd: "5k"',
        "data/budgets.yaml:23: teams.research.monthly_usd: expected a number or null, got '5k'",
    ),
    "monthly_usd: -100": (
        "budgets",
        "monthly_usd: 20000",
        "monthly_usd: -100",
        "data/budgets.yaml:23: teams.research.monthly_usd: must be greater than 0 or null, got -100",
    ),
    "monthly_usd: 0 (reads as no budget)": (
        "budgets",
        "monthly_usd: 20000",
        "monthly_usd: 0",
        "teams.research.monthly_usd: must be greater than 0 or null, got 0",
    ),
    "a quoted number": (
        "budgets",
        "monthly_usd: 20000",
        'monthly_usd: "20000"',
        "teams.research.monthly_usd: expected a number or null, got '20000'",
    ),
    "a team without monthly_usd": (
        "budgets",
        RESEARCH,
        "  research:\n    kind: hard\n",
        "data/budgets.yaml:22: teams.research.monthly_usd: missing (this key is required)",
    ),
    "unknown top-level key": (
        "budgets",
        "\nteams:\n",
        "\nteam:\n",
        "data/budgets.yaml:21: team: unknown key (did you mean teams?)",
    ),
    "a threshold that is not a number": (
        "budgets",
        "thresholds_pct: [50, 80, 100]",
        'thresholds_pct: [50, "80", 100]',
        "data/budgets.yaml:13: thresholds_pct[1]: expected a number, got '80'",
    ),
    "a default kind that does not exist": (
        "budgets",
        "  kind: soft\n",
        "  kind: alert\n",
        "default.kind: 'alert' is not one of hard, soft",
    ),
    "a team entry that is not a mapping": (
        "budgets",
        RESEARCH,
        "  research: 20000\n",
        "data/budgets.yaml:22: teams.research: expected a mapping, got 20000",
    ),
    "a section left empty": (
        "placement",
        "queues:\n  eu-batch:\n    regions: [eu-west-1, europe-west4, westeurope]\n",
        "queues:\n",
        "data/placement.yaml:20: queues: expected a mapping, got null (write {} for none)",
    ),
    "bad capacity value": (
        "priorities",
        "capacity: spot_only",
        "capacity: spot_onyl",
        "teams.interns.capacity: 'spot_onyl' is not one of any, spot_only, on_demand_only",
    ),
    "negative nominal quota": (
        "priorities",
        INTERNS_Q,
        "quota: {nominal_gpus: -4, borrowing_limit_gpus: 4}",
        "teams.interns.quota.nominal_gpus: must be at least 0, got -4",
    ),
    "negative borrowing limit": (
        "priorities",
        INTERNS_Q,
        "quota: {nominal_gpus: 4, borrowing_limit_gpus: -1}",
        "teams.interns.quota.borrowing_limit_gpus: must be at least 0, got -1",
    ),
    "fractional lending limit": (
        "priorities",
        INTERNS_Q,
        "quota: {nominal_gpus: 4, lending_limit_gpus: 1.5}",
        "teams.interns.quota.lending_limit_gpus: expected a whole number, got 1.5",
    ),
    "a quota key typo": (
        "priorities",
        INTERNS_Q,
        "quota: {nominal_gpus: 4, lend_limit_gpus: 2}",
        "teams.interns.quota.lend_limit_gpus: unknown key (did you mean lending_limit_gpus?)",
    ),
    "a quota without nominal_gpus": (
        "priorities",
        INTERNS_Q,
        "quota: {borrowing_limit_gpus: 4}",
        "teams.interns.quota.nominal_gpus: missing (this key is required)",
    ),
    "tier missing from tiers": (
        "priorities",
        "tier: standard",
        "tier: standrad",
        "data/priorities.yaml:31: teams.research.tier: tier 'standrad' is not defined in `tiers` (did you mean standard?)",
    ),
    "default tier missing from tiers": (
        "priorities",
        "  tier: batch\n  capacity: any\n",
        "  tier: bulk\n  capacity: any\n",
        "default.tier: tier 'bulk' is not defined in `tiers`",
    ),
    "a tier weight of zero": (
        "priorities",
        "batch:    {tier: 1, weight: 1}",
        "batch:    {tier: 1, weight: 0}",
        "tiers.batch.weight: must be greater than 0, got 0",
    ),
    "onprem_first not a boolean": (
        "placement",
        "onprem_first: true",
        'onprem_first: "yes"',
        "data/placement.yaml:7: onprem_first: expected true or false, got 'yes'",
    ),
    "negative spot price cap": (
        "placement",
        "max_spot_price_usd: 2.5",
        "max_spot_price_usd: -2.5",
        "teams.interns.max_spot_price_usd: must be greater than 0 or null, got -2.5",
    ),
    "regions as a string": (
        "placement",
        "regions: [local, us-east-1]",
        "regions: us-east-1",
        "teams.interns.regions: expected a list, got 'us-east-1'",
    ),
    "region for regions": (
        "placement",
        "    regions: [eu-west-1",
        "    region: [eu-west-1",
        "queues.eu-batch.region: unknown key (did you mean regions?)",
    ),
    "negative pool cap": (
        "placement",
        "max_instances: 8",
        "max_instances: -1",
        "data/placement.yaml:27: pools.aws-a100.max_instances: must be at least 0, got -1",
    ),
}


def _break(directory: Path, name: str) -> tuple[str, str]:
    file, old, new, expected = BAD[name]
    path = directory / "data" / f"{file}.yaml"
    text = path.read_text()
    assert old in text, f"the shipped data/{file}.yaml changed; update case {name!r}"
    path.write_text(text.replace(old, new, 1))
    return file, expected


@pytest.mark.parametrize("name", list(BAD))
def test_bad_data_is_refused_with_file_line_path_and_expectation(tmp_path, name):
    directory = copy_policies(tmp_path)
    file, expected = _break(directory, name)
    with pytest.raises(PolicyError) as caught:
        load_bundle(directory)
    problems = [str(p) for p in caught.value.problems]
    assert any(expected in p for p in problems), problems
    assert all("\n" not in p and p.startswith(f"data/{file}.yaml") for p in problems), problems
    # The published model (docs/schemas) refuses it too.
    doc = yaml.safe_load((directory / "data" / f"{file}.yaml").read_text())
    with pytest.raises(ValidationError):
        SHIPPED[file].model_validate(doc)


def test_every_problem_of_a_file_is_listed_not_only_the_first(tmp_path):
    directory = copy_policies(tmp_path)
    for name in ("kind: hardd", "bad capacity value", "negative pool cap"):
        _break(directory, name)
    with pytest.raises(PolicyError) as caught:
        load_bundle(directory)
    assert sorted(p.file for p in caught.value.problems) == [
        "data/budgets.yaml",
        "data/placement.yaml",
        "data/priorities.yaml",
    ]


def test_a_data_file_that_is_not_a_mapping(tmp_path):
    directory = copy_policies(tmp_path)
    (directory / "data" / "budgets.yaml").write_text("- research\n- interns\n")
    with pytest.raises(PolicyError, match=r"data/budgets.yaml:1: expected a mapping, got a list"):
        load_bundle(directory)


def test_the_shipped_data_files_match_their_schemas():
    data_dir = shipped_policy_dir() / "data"
    assert sorted(p.stem for p in data_dir.glob("*.yaml")) == sorted(SHIPPED)
    for name, model in SHIPPED.items():
        model.model_validate(yaml.safe_load((data_dir / f"{name}.yaml").read_text()))
    load_bundle(shipped_policy_dir())  # and the loader's check finds nothing


def test_the_published_schemas_are_in_docs():
    docs = shipped_policy_dir().parent / "docs" / "schemas"
    for name, model in SHIPPED.items():
        published = json.loads((docs / f"policy-data-{name}.v1.json").read_text())
        assert published == model.model_json_schema()
    budgets = json.loads((docs / "policy-data-budgets.v1.json").read_text())
    assert budgets["$defs"]["TeamBudget"]["properties"]["kind"]["enum"] == ["hard", "soft"]
    quota = json.loads((docs / "policy-data-priorities.v1.json").read_text())["$defs"]["Quota"]
    assert sorted(quota["properties"]) == ["borrowing_limit_gpus", "lending_limit_gpus", "nominal_gpus"]


# ---------------------------------------------------------------- hot reload


def test_reload_keeps_the_last_good_bundle_when_a_data_file_breaks(tmp_path):
    directory = copy_policies(tmp_path)
    service = PolicyService(PolicyConfig(dir=str(directory), timeout_s=10), isolate=False)
    over = complete_input(
        {"now": NOW, "teams": [{"name": "research", "month_to_date_usd": 100000, "forecast_usd": 100000}]}
    )
    try:
        good = service.revision
        assert service.evaluate(over).decision.team("research").may_scale_up is False  # hard, at 500 %
        _break(directory, "kind: hardd")
        outcome = service.check_for_changes()  # the file watch
        assert outcome is not None and not outcome.ok
        assert outcome.revision == good and service.revision == good
        assert "data/budgets.yaml:24: teams.research.kind: 'hardd' is not one of hard, soft" in outcome.message
        status = service.status()
        assert status["revision"] == good and status["last_reload_error"] == outcome.message
        assert REGISTRY.get_sample_value("autoscaler_policy_reload_ok") == 0
        # The old (hard) budget still decides: no scale-up at 500 %, and drained.
        result = service.evaluate(over)
        assert result.revision == good and result.error is None
        assert result.decision.team("research").may_scale_up is False and result.decision.team("research").drain
        # Fixed: the watch puts it in force again and clears the error.
        budgets = directory / "data" / "budgets.yaml"
        budgets.write_text(budgets.read_text().replace("kind: hardd", "kind: hard"))
        outcome = service.check_for_changes()
        assert outcome is not None and outcome.ok and service.status()["last_reload_error"] is None
    finally:
        service.close()


def test_a_bad_data_file_at_start_is_refused(tmp_path):
    directory = copy_policies(tmp_path)
    _break(directory, "monthy_usd (typo in a key)")
    with pytest.raises(PolicyError, match=r"cannot be put in force: .*teams.research.monthy_usd: unknown key"):
        PolicyService(PolicyConfig(dir=str(directory)), isolate=False)


# ---------------------------------------------------------------- a user's own schema

LIMITS_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "max_gpus_per_task": {"type": "integer", "minimum": 1},
        "owners": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["max_gpus_per_task"],
}


def _with_limits(directory: Path, text: str) -> None:
    (directory / "data" / "limits.yaml").write_text(text)
    (directory / "data" / "limits.schema.json").write_text(json.dumps(LIMITS_SCHEMA, indent=2))


def test_a_users_schema_is_applied_to_its_data_file(tmp_path):
    directory = copy_policies(tmp_path)
    _with_limits(directory, "# our limits\nmax_gpus_per_task: 0\nowner: [finops]\n")
    with pytest.raises(PolicyError) as caught:
        load_bundle(directory)
    assert [str(p) for p in caught.value.problems] == [
        "data/limits.yaml:2: max_gpus_per_task: must be at least 1, got 0",
        "data/limits.yaml:3: owner: unknown key (did you mean owners?)",
    ]


def test_a_users_data_file_that_matches_its_schema_is_data_and_the_schema_is_not(tmp_path):
    directory = copy_policies(tmp_path)
    _with_limits(directory, "max_gpus_per_task: 8\nowners: [finops]\n")
    bundle = load_bundle(directory)
    assert bundle.data["limits"] == {"max_gpus_per_task": 8, "owners": ["finops"]}
    assert "limits.schema" not in bundle.data


def test_a_data_file_without_a_schema_is_accepted_as_before(tmp_path):
    directory = copy_policies(tmp_path)
    (directory / "data" / "notes.yaml").write_text("anything: [goes, 1, {here: true}]\n")
    assert load_bundle(directory).data["notes"] == {"anything": ["goes", 1, {"here": True}]}


def test_a_users_schema_for_a_shipped_file_applies_on_top(tmp_path):
    directory = copy_policies(tmp_path)
    every_team_hard = {
        "type": "object",
        "properties": {"teams": {"additionalProperties": {"properties": {"kind": {"const": "hard"}}}}},
    }
    (directory / "data" / "budgets.schema.json").write_text(json.dumps(every_team_hard))
    with pytest.raises(PolicyError) as caught:
        load_bundle(directory)
    assert [str(p) for p in caught.value.problems] == [
        "data/budgets.yaml:27: teams.prod-inference.kind: 'soft' is not 'hard'"
    ]


@pytest.mark.parametrize(
    ("schema_text", "expected"),
    [
        ('{"type": "object",', "data/limits.schema.json:1:"),
        ('{"type": "nonsense"}', "data/limits.schema.json: not a valid JSON Schema: type:"),
        ("[1, 2]", "data/limits.schema.json:1: a JSON Schema must be an object"),
    ],
)
def test_a_broken_user_schema_is_reported(tmp_path, schema_text, expected):
    directory = copy_policies(tmp_path)
    (directory / "data" / "limits.yaml").write_text("max_gpus_per_task: 8\n")
    (directory / "data" / "limits.schema.json").write_text(schema_text)
    with pytest.raises(PolicyError) as caught:
        load_bundle(directory)
    assert any(str(p).startswith(expected) for p in caught.value.problems), caught.value.problems


def test_a_schema_without_its_data_file_is_reported(tmp_path):
    directory = copy_policies(tmp_path)
    (directory / "data" / "limts.schema.json").write_text(json.dumps(LIMITS_SCHEMA))
    with pytest.raises(PolicyError, match=r"data/limts.schema.json: no data file data/limts.yaml"):
        load_bundle(directory)


# ---------------------------------------------------------------- the CLI


@pytest.mark.parametrize("command", ["check", "test"])
def test_cli_refuses_bad_data_one_line_per_problem(tmp_path, command):
    directory = copy_policies(tmp_path)
    for name in ("monthy_usd (typo in a key)", "bad capacity value"):
        _break(directory, name)
    r = runner.invoke(app, ["policy", command, str(directory)])
    assert r.exit_code != 0
    lines = r.output.splitlines()
    assert "data/budgets.yaml:23: teams.research.monthy_usd: unknown key (did you mean monthly_usd?)" in lines
    assert "data/budgets.yaml:22: teams.research.monthly_usd: missing (this key is required)" in lines
    assert any(line.startswith("data/priorities.yaml:") and "'spot_onyl' is not one of" in line for line in lines)
    assert isinstance(r.exception, PolicyError)
    assert "3 problem(s) in" in str(r.exception) and "policy data does not match its schema" in str(r.exception)
    assert "PASS" not in r.output


def test_cli_exits_non_zero_without_a_traceback(tmp_path):
    directory = copy_policies(tmp_path)
    _break(directory, "kind: hardd")
    root = shipped_policy_dir().parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run(
        [sys.executable, "-m", "autoscaler", "policy", "check", str(directory)],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "teams.research.kind: 'hardd' is not one of hard, soft" in proc.stdout
    assert proc.stderr.startswith("error: 1 problem(s) in") and "Traceback" not in proc.stderr + proc.stdout
