"""The policy directory's `data/budgets.yaml` as the simulator reads it: to know WHEN a
decision could change (threshold crossings) and to report budget adherence. The
decisions themselves are always the policy's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_THRESHOLDS_PCT = (50.0, 80.0, 100.0)


@dataclass(frozen=True)
class Budget:
    monthly_usd: float | None  # None: no budget
    kind: str = "soft"


@dataclass(frozen=True)
class BudgetFile:
    thresholds_pct: tuple[float, ...] = DEFAULT_THRESHOLDS_PCT
    default: Budget = Budget(None)
    teams: dict[str, Budget] = field(default_factory=dict)

    def of(self, team: str) -> Budget:
        """The entry that applies to a team: its own, else the default."""
        return self.teams.get(team, self.default)


def read_budgets(policy_dir: Path) -> BudgetFile | None:
    """None when the file is missing or is not a mapping."""
    try:
        doc = yaml.safe_load((policy_dir / "data" / "budgets.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    teams = doc.get("teams") or {}
    return BudgetFile(
        thresholds_pct=tuple(sorted(float(x) for x in doc.get("thresholds_pct", DEFAULT_THRESHOLDS_PCT))),
        default=_budget(doc.get("default")),
        teams={str(t): _budget(conf) for t, conf in teams.items() if conf},
    )


def _budget(conf: Any) -> Budget:
    if not isinstance(conf, dict):
        return Budget(None)
    usd = conf.get("monthly_usd")
    return Budget(float(usd) if isinstance(usd, int | float) else None, str(conf.get("kind", "soft")))
