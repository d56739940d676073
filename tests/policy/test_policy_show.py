"""Issue 23 item 11: `autoscaler policy show` says which policy is in force (through a
real `autoscaler up` process), and policy test cases may set a numeric tolerance."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from autoscaler.policy.bundle import load_bundle
from autoscaler.policy.cases import mismatches
from autoscaler.policy.problems import PolicyError
from tests.conftest import REPO, free_port
from tests.local_up import local_up


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env, "COLUMNS": "200"},
        timeout=60,
        cwd=REPO,
    )


def test_policy_show_names_the_policy_in_force(tmp_path: Path) -> None:
    with local_up(tmp_path, reconcile={"interval_s": 600}) as up:  # no cycle needed
        home, log = up.home, up.log
        env = {"AUTOSCALER_HOME": str(home), "AUTOSCALER_SERVER": up.base}
        shown = _cli("policy", "show", env=env)  # the admin token from HOME
        assert shown.returncode == 0, shown.stderr + log.read_text()[-2000:]
        text = shown.stdout
        assert "policy in force: revision " in text and "engine: embedded" in text
        assert "budgets.rego" in text and "test cases passed: " in text
        assert "data:" in text and "monthly_usd" in text
        status = json.loads(_cli("policy", "show", "--json", env=env).stdout)
        assert status["test_cases_passed"] >= 30 and len(status["revision"]) == 16
        assert status["directory"].endswith("policies") and "budgets.rego" in status["modules"]

        admin = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
        made = httpx.post(f"{up.base}/api/v1/tokens", json={"kind": "team", "team": "vision"}, headers=admin)
        team = _cli("policy", "show", "--json", env={**env, "AUTOSCALER_TOKEN": made.json()["token"]})
        assert team.returncode == 0 and json.loads(team.stdout)["data"] is None  # budgets are FinOps'


def test_policy_show_against_a_server_without_the_policy_service(tmp_path: Path) -> None:
    port = free_port()
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "server", "--home", str(home), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        r = _cli("policy", "show", env={"AUTOSCALER_HOME": str(home), "AUTOSCALER_SERVER": f"http://127.0.0.1:{port}"})
        assert r.returncode == 1 and "not running in this process" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_numbers_match_within_the_cases_tolerance() -> None:
    assert mismatches({"h": 0.0026}, {"h": 0.002604167}) == [
        "decision.h: expected 0.0026, got 0.002604167 (tolerance 1e-06)"
    ]
    assert mismatches({"h": 0.0026}, {"h": 0.002604167}, tolerance=0.01) == []
    assert mismatches({"f": 1000.0}, {"f": 1009.0}, tolerance=0.01) == []  # relative above 1
    assert mismatches({"f": 1000.0}, {"f": 1011.0}, tolerance=0.01) != []


def _case_dir(tmp_path: Path, case: dict[str, object]) -> Path:
    (tmp_path / "tests").mkdir(parents=True)
    (tmp_path / "decision.rego").write_text("package autoscaler\n\nimport rego.v1\n\ndecision := {}\n")
    (tmp_path / "tests" / "t.yaml").write_text(yaml.safe_dump({"cases": [case]}))
    return tmp_path


def test_a_case_sets_its_tolerance_and_a_bad_one_is_refused(tmp_path: Path) -> None:
    base = {"name": "c", "input": {"now": "2026-03-01T00:00:00Z"}, "expect": {}}
    (case,) = load_bundle(_case_dir(tmp_path / "ok", {**base, "tolerance": 0.01})).cases
    assert case.tolerance == 0.01
    (default,) = load_bundle(_case_dir(tmp_path / "default", base)).cases
    assert default.tolerance == 1e-6
    for bad in ("big", -1, 2, True):
        with pytest.raises(PolicyError) as err:
            load_bundle(_case_dir(tmp_path / f"bad-{bad}", {**base, "tolerance": bad}))
        assert "tolerance must be a number from 0 to below 1" in str(err.value.problems[0])
