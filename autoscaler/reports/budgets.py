"""Monthly team budgets, read from the policy data FinOps edit (`policies/data/*.yaml`).

The policy owns budgets; the dashboard and the metrics only display them, so this
reads the same files rather than keeping a second copy. The reader takes the
shipped shape (`teams: {vision: {monthly_usd: 500}}`, `default: {monthly_usd: ...}`
in `budgets.yaml`) and a list of `{name, monthly_usd}`; a file it cannot read yields no budget
rather than an error page, because a broken policy file is reported by the policy
service, with file and line.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml

from autoscaler.config import AutoscalerConfig

log = logging.getLogger(__name__)
BUDGET_KEYS = ("monthly_usd", "monthly_budget_usd", "budget_usd", "monthly_budget", "budget")
# Where a budget for "any team not listed" is kept (`default: {monthly_usd: ...}`).
DEFAULT = "*"


def policy_dir(config: AutoscalerConfig) -> Path:
    if config.policy.dir:
        return Path(config.policy.dir)
    return Path(__file__).resolve().parents[2] / "policies"


def _budget_of(entry: Any) -> float | None:
    if isinstance(entry, int | float) and not isinstance(entry, bool):
        return float(entry)
    if isinstance(entry, dict):
        for key in BUDGET_KEYS:
            value = entry.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                return float(value)
    return None


def _teams_section(doc: Any) -> dict[str, Any]:
    section = doc.get("teams") if isinstance(doc, dict) else None
    if isinstance(section, list):
        return {str(item["name"]): item for item in section if isinstance(item, dict) and "name" in item}
    return section if isinstance(section, dict) else {}


def _data_files(directory: Path) -> dict[str, Path]:
    if not directory.is_dir():
        return {}
    return {p.stem: p for p in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml"), *directory.glob("*.json")])}


def load_budgets(directory: Path, data_dir: Path | None = None) -> dict[str, float]:
    """Team -> monthly budget in USD, from every YAML/JSON file under `directory/data`,
    those of `data_dir` (the deployment's `policy.data_dir`) replacing the same-named."""
    budgets: dict[str, float] = {}
    files = _data_files(directory / "data")
    if data_dir is not None:
        files.update(_data_files(data_dir))
    for path in (files[name] for name in sorted(files)):
        try:
            doc = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as exc:
            log.warning("cannot read budgets from %s: %s", path, exc)
            continue
        for team, entry in _teams_section(doc).items():
            budget = _budget_of(entry)
            if budget is not None:
                budgets[str(team)] = budget
        default = _budget_of(doc.get("default")) if isinstance(doc, dict) else None
        if default is not None:
            budgets[DEFAULT] = default
    return budgets


def team_budgets(config: AutoscalerConfig) -> dict[str, float]:
    """Budget per team this deployment declares; the default budget fills those not listed.

    Teams the policy data lists but `autoscaler.yaml` does not (a team since removed,
    a copied example) are left out: a spend table shows this
    deployment's teams, not every name in a policy file."""
    data_dir = Path(config.policy.data_dir) if config.policy.data_dir else None
    listed = load_budgets(policy_dir(config), data_dir)
    default = listed.pop(DEFAULT, None)
    budgets: dict[str, float] = {}
    for team in config.teams:
        budget = listed.get(team.name, default)
        if budget is not None:
            budgets[team.name] = budget
    return budgets
