"""Policy data naming a team the config does not declare loads, with a warning that
names the team, the file and line, and the declared teams: in `autoscaler policy
check --config` and in the service's log at each load (it loaded silently)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.config import PolicyConfig, load_config
from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.data_teams import undeclared_teams
from autoscaler.policy.service import PolicyService

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"
EXAMPLE_DATA = EXAMPLE.parent / "policy-data"
CONFIG = "teams:\n  - {name: vision}\n  - {name: nlp}\npolicy:\n  data_dir: data\n"


def _deployment(tmp_path: Path, budget_team: str) -> Path:
    """A config declaring vision and nlp, whose data dir budgets `budget_team` and vision."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(EXAMPLE_DATA / "priorities.yaml", data)
    (data / "budgets.yaml").write_text(
        "thresholds_pct: [50, 80, 100]\n"
        "teams:\n"
        "  vision: {monthly_usd: 20000, kind: hard}\n"
        f"  {budget_team}: {{monthly_usd: 5000, kind: soft}}\n"
    )
    config = tmp_path / "autoscaler.yaml"
    config.write_text(CONFIG)
    return config


def _check(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "AUTOSCALER_CONFIG"}
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", "policy", "check", str(shipped_policy_dir()), *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "400"},
        timeout=120,
    )


def test_policy_check_warns_of_an_undeclared_team_and_still_passes(tmp_path: Path) -> None:
    config = _deployment(tmp_path, "nlpp")
    r = _check("--config", str(config))  # its data_dir is the data checked
    assert r.returncode == 0, r.stdout + r.stderr
    (warning,) = [line for line in r.stdout.splitlines() if line.startswith("warning:")]
    assert "/budgets.yaml:4: teams.nlpp: team 'nlpp' is not declared in the config" in warning, warning
    assert "(teams: default, vision, nlp)" in warning and "did you mean 'nlp'?" in warning
    assert "ok:" in r.stdout
    # Without a config there are no declared teams to compare with: no warning.
    quiet = _check("--data-dir", str(tmp_path / "data"))
    assert quiet.returncode == 0 and "warning:" not in quiet.stdout, quiet.stdout


def test_policy_check_of_a_deployment_whose_teams_are_declared_is_quiet() -> None:
    r = _check("--config", str(EXAMPLE))
    assert r.returncode == 0 and "warning:" not in r.stdout and "ok:" in r.stdout, r.stdout + r.stderr


def test_the_service_logs_the_warning_at_each_load_and_keeps_the_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = load_config(_deployment(tmp_path, "nlpp"))
    caplog.set_level(logging.WARNING, logger="autoscaler.policy.service")
    service = PolicyService(cfg.policy, isolate=False, teams=cfg.team_names())
    try:
        _, data = service.in_force()
        assert data is not None and set(data["budgets"]["teams"]) == {"vision", "nlpp"}  # loaded, in force
        (logged,) = [r.getMessage() for r in caplog.records if "nlpp" in r.getMessage()]
        assert "teams.nlpp: team 'nlpp' is not declared in the config (teams: default, vision, nlp)" in logged
        caplog.clear()
        budgets = tmp_path / "data" / "budgets.yaml"
        budgets.write_text(budgets.read_text().replace("nlpp", "nlp"))
        assert service.reload().ok
        assert not [r for r in caplog.records if "not declared" in r.getMessage()]  # fixed: quiet
    finally:
        service.close()


def test_every_teams_file_and_the_default_team() -> None:
    bundle = load_bundle(shipped_policy_dir(), with_cases=False)
    data = {
        "budgets": {"teams": {"default": {"monthly_usd": 1}, "vision": {"monthly_usd": 1}}},
        "priorities": {"teams": {"research": {"tier": "batch"}}},
        "placement": {"teams": {"interns": {"pools": ["p"]}}, "pools": {"not-a-team": {"max_instances": 1}}},
    }
    notes = undeclared_teams(data, bundle.sources, ["default", "vision"])
    assert [(n.file, n.message.split(":")[0]) for n in notes] == [
        ("data/priorities.yaml", "teams.research"),
        ("data/placement.yaml", "teams.interns"),
    ]
    # The simulator compares nothing (its teams come from its trace).
    service = PolicyService(PolicyConfig(), isolate=False)
    service.close()
    assert service.teams is None
