"""Demo teams live in the example config and the test fixtures only: the shipped data
names no team, a deployment brings its own (`policy.data_dir`), and a test case may
run on other data (`data_dir:` per file, `data:` per file or case)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from autoscaler.config import load_config
from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import check_and_test
from autoscaler.policy.engines import EmbeddedEngine
from autoscaler.policy.problems import PolicyError
from autoscaler.policy.service import PolicyService
from tests.policy.helpers import DEMO_DATA, NOW, copy_policies

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"
DEMO_TEAMS = {"research", "interns", "prod-inference"}


def test_the_shipped_data_names_no_team() -> None:
    data = load_bundle(shipped_policy_dir(), with_cases=False).data
    for name in ("budgets", "placement", "priorities"):
        assert data[name]["teams"] == {}, name
    assert data["placement"]["pools"] == {} and data["placement"]["queues"] == {}
    # ...while the cases still run on the demo teams, and all pass.
    bundle = load_bundle(shipped_policy_dir())
    assert all(c.data is not None and set(c.data["budgets"]["teams"]) >= DEMO_TEAMS for c in bundle.cases)
    engine = EmbeddedEngine(bundle, isolate=False)
    try:
        report = check_and_test(bundle, engine)
        assert report.ok, report.summary()
        assert len(report.results) >= 30
    finally:
        engine.close()


def test_the_example_config_brings_its_own_teams_from_its_data_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # a relative data_dir is the config file's, not the cwd's
    cfg = load_config(EXAMPLE)
    assert cfg.policy.data_dir is not None and Path(cfg.policy.data_dir).is_dir()
    service = PolicyService(cfg.policy, isolate=False)
    try:
        _, data = service.in_force()
        assert data is not None
        assert set(data["budgets"]["teams"]) == {t.name for t in cfg.teams}
        assert not DEMO_TEAMS & set(data["budgets"]["teams"])
        assert service.status()["data_dir"] == cfg.policy.data_dir
    finally:
        service.close()


def test_a_missing_data_dir_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"does not exist; set policy\.data_dir"):
        load_bundle(shipped_policy_dir(), data_dir=tmp_path / "nowhere")


def test_a_data_dir_is_checked_against_the_schemas(tmp_path: Path) -> None:
    bad = tmp_path / "data"
    bad.mkdir()
    (bad / "budgets.yaml").write_text("teams:\n  vision: {monthly_usd: 5k, kind: hard}\n")
    with pytest.raises(PolicyError) as info:
        load_bundle(shipped_policy_dir(), data_dir=bad)
    assert any("teams.vision.monthly_usd" in p.message for p in info.value.problems)


def _cases(directory: Path, doc: dict[str, object]) -> None:
    (directory / "tests").mkdir(exist_ok=True)
    for old in (directory / "tests").glob("*.yaml"):
        old.unlink()
    (directory / "tests" / "mine.yaml").write_text(yaml.safe_dump(doc))


def test_a_case_may_override_the_data_it_runs_on(tmp_path: Path) -> None:
    policies = copy_policies(tmp_path, demo=False)
    over = {"now": NOW, "teams": [{"name": "vision", "month_to_date_usd": 1500, "forecast_usd": 1500}]}
    budget = {"budgets": {"teams": {"vision": {"monthly_usd": 1000, "kind": "hard"}}}}
    _cases(
        policies,
        {
            "cases": [
                {"name": "no budget: may scale", "input": over, "expect": {"teams": {"vision": {"drain": False}}}},
                {
                    "name": "a hard budget of 1000: drained",
                    "data": budget,
                    "input": over,
                    "expect": {"teams": {"vision": {"drain": True}}},
                },
                # The override must matter: the same case with the wrong expectation fails.
                {"name": "wrong", "data": budget, "input": over, "expect": {"teams": {"vision": {"drain": False}}}},
            ]
        },
    )
    bundle = load_bundle(policies)
    engine = EmbeddedEngine(bundle, isolate=False)
    try:
        results = check_and_test(bundle, engine).results
    finally:
        engine.close()
    assert [r.passed for r in results] == [True, True, False]
    assert results[2].failures == ["decision.teams.vision.drain: expected False, got True"]


def test_a_file_data_dir_that_is_not_there_is_refused(tmp_path: Path) -> None:
    policies = copy_policies(tmp_path, demo=False)
    _cases(policies, {"data_dir": "nope", "cases": [{"input": {"now": NOW}, "expect": {}}]})
    with pytest.raises(PolicyError) as info:
        load_bundle(policies)
    assert "data_dir 'nope' is not a directory" in info.value.problems[0].message


def test_the_demo_fixtures_are_the_data_the_shipped_cases_name() -> None:
    teams = yaml.safe_load((DEMO_DATA / "budgets.yaml").read_text())["teams"]
    assert set(teams) == DEMO_TEAMS
