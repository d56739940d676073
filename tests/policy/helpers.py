"""Helpers for the policy tests: a private copy of the shipped policies to break."""

from __future__ import annotations

import shutil
from pathlib import Path

from autoscaler.policy.bundle import shipped_policy_dir

NOW = "2026-03-16T00:00:00Z"
# The demo teams (research, interns, prod-inference) the shipped cases run on; the
# shipped data/ names no team.
DEMO_DATA = shipped_policy_dir() / "tests" / "fixtures"


def copy_policies(tmp_path: Path, *, demo: bool = True) -> Path:
    """A private copy of the shipped policies; with `demo`, its data/ is the demo data
    the shipped cases run on (so a test may edit budgets.yaml by its line numbers)."""
    target = tmp_path / "policies"
    shutil.copytree(shipped_policy_dir(), target)
    if demo:
        for path in DEMO_DATA.glob("*.yaml"):
            shutil.copy(path, target / "data" / path.name)
    return target


def write_module(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(source)
    return path


SLOW_POLICY = """package autoscaler

import rego.v1

# About 8 M iterations: seconds in regorus (0.3 M took 0.3 s), far longer in rego-cpp;
# long enough to kill or time out in either.
r := numbers.range(1, 200)

spin := count([1 | r[i]; r[j]; r[k]]) if input.fleet.slow == 1

decision := {"warn": [sprintf("spun %d", [spin])]} if {
	input.fleet.slow == 1
} else := {"warn": ["fast"]}
"""
