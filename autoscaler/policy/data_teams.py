"""Teams the policy data names that the config does not declare.

Tasks belong to the teams of the config's `teams:` (and `default`, the team of
admin-enqueued work): an entry under `teams:` in budgets.yaml, priorities.yaml or
placement.yaml for any other name applies to no task. That is most often a typo
(`visoin`) or a team not yet added to the config, and the budget the user meant to
set is then not in force. It is a warning, not a refusal: one data directory may
serve deployments with different teams, and test fixtures name demo teams
(docs/policies.md, "Teams the config does not declare").
"""

from __future__ import annotations

import difflib
from collections.abc import Collection, Mapping
from typing import Any

from autoscaler.policy.data_schema import key_line
from autoscaler.policy.problems import Problem

# The shipped data files whose `teams:` map team names to settings.
FILES_WITH_TEAMS = ("budgets", "priorities", "placement")


def undeclared_teams(
    data: Mapping[str, Any], sources: Mapping[str, tuple[str, str]], declared: Collection[str]
) -> list[Problem]:
    """One warning per team entry of the data that `declared` (the config's team names,
    `default` included) lacks, with the file and line of the entry. `sources` is
    `PolicyBundle.sources`: where each data document was read."""
    notes: list[Problem] = []
    known = ", ".join(declared) or "none"
    for name in FILES_WITH_TEAMS:
        doc = data.get(name)
        teams = doc.get("teams") if isinstance(doc, dict) else None
        if not isinstance(teams, dict):
            continue
        rel, text = sources.get(name, (f"data/{name}.yaml", ""))
        for team in teams:
            if str(team) in declared:
                continue
            close = difflib.get_close_matches(str(team), list(declared), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            notes.append(
                Problem(
                    rel,
                    key_line(text, ["teams", team]) if text else None,
                    f"teams.{team}: team {str(team)!r} is not declared in the config (teams: {known}), so this "
                    f"entry applies to no task; {hint}add it under teams: in autoscaler.yaml or fix the name",
                )
            )
    return notes
