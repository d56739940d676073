"""One team's part of a decision row: what a team token may read of `autoscaler
explain`. It keeps the team's own policy answer, the holds of its tasks, the
launches for it and the alerts about it, and drops everything that names or sizes
another team (the fleet summary, other teams' answers, drains and terminations,
the fleet-wide explanation sentences, the policy's error text)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FAILED_SAFE = "the policy could not be evaluated: no team may grow until it is fixed, running work is kept"


def _mine(items: Any, team: str) -> list[dict[str, Any]]:
    return [x for x in items or [] if isinstance(x, dict) and x.get("team") == team]


def team_lines(result: Mapping[str, Any], plan: Mapping[str, Any], team: str) -> list[str]:
    lines: list[str] = []
    if result.get("fail_safe") or result.get("error"):
        lines.append(f"policy failed safe: {FAILED_SAFE}")
    td = (result.get("teams") or {}).get(team)
    if isinstance(td, dict):
        verdict = "may grow" if td.get("may_scale_up", True) else "may not grow"
        if td.get("drain"):
            verdict += ", draining"
        if td.get("spend_headroom_per_hour") is not None:
            verdict += f", spend headroom {float(td['spend_headroom_per_hour']):.2f} USD/h"
        lines.append(
            f"team {team}: {verdict}" + ("; " + "; ".join(td.get("reasons") or []) if td.get("reasons") else "")
        )
    for a in _mine(result.get("alerts"), team):
        lines.append(f"alert ({a.get('level', '?')}, team {team}): {a.get('message', '')}")
    for x in _mine(plan.get("launches"), team):
        lines.append(
            f"launch {x.get('offering')} in pool {x.get('pool')} for team {team} "
            f"({x.get('tasks', 0)} task(s)): {str(x.get('reason', '')).split(';')[0]}"
        )
    for h in _mine(plan.get("holds"), team):
        gpus = f", {h['gpus']} GPU(s)" if h.get("gpus") else ""
        lines.append(
            f"hold {h.get('tasks', 0)} task(s){gpus} of team {team} in queue {h.get('queue')}: {h.get('reason')}"
        )
    if len(lines) == 0:
        lines.append(f"nothing about team {team} in this cycle")
    return lines


def team_decision(row: Mapping[str, Any], team: str) -> dict[str, Any]:
    """The decision row (as the API serialises it) reduced to `team`'s part."""
    result = row.get("result") or {}
    plan = row.get("plan") or {}
    td = (result.get("teams") or {}).get(team)
    launches = _mine(plan.get("launches"), team)
    holds = _mine(plan.get("holds"), team)
    return {
        "id": row["id"],
        "at": row["at"],
        "policy_revision": row.get("policy_revision", ""),
        "input_digest": "",
        "eval_ms": row.get("eval_ms", 0.0),
        "cycle_ms": row.get("cycle_ms", 0.0),
        "summary": {"team": team, "held_tasks": sum(int(h.get("tasks", 0)) for h in holds)},
        "result": {
            "revision": result.get("revision"),
            "fail_safe": bool(result.get("fail_safe")),
            "error": FAILED_SAFE if result.get("error") else None,
            "teams": {team: td} if isinstance(td, dict) else {},
            "alerts": _mine(result.get("alerts"), team),
        },
        "plan": {"launches": launches, "holds": holds, "launches_count": len(launches), "holds_count": len(holds)},
        "reasons": team_lines(result, plan, team),
        "error": FAILED_SAFE if row.get("error") else None,
    }


def verdict(result: Mapping[str, Any], plan: Mapping[str, Any], team: str) -> str | None:
    """What one recorded decision said about `team` ("may grow" only if nothing of
    the team was held by its budget or quota), or None if it said nothing."""
    if result.get("fail_safe") or result.get("error"):
        return "may not grow: the policy could not be evaluated (fail-safe)"
    td = (result.get("teams") or {}).get(team)
    held = [str(h.get("reason", "")) for h in _mine(plan.get("holds"), team)]
    reasons = "; ".join(td.get("reasons") or []) if isinstance(td, dict) else ""
    tail = f" ({reasons})" if reasons else ""
    if isinstance(td, dict):
        if td.get("drain"):
            return f"may not grow: being drained{tail}"
        if not td.get("may_scale_up", True):
            return f"may not grow: frozen by the policy{tail}"
        headroom = td.get("spend_headroom_per_hour")
        if headroom is not None and float(headroom) <= 1e-9:
            return f"may not grow: spend headroom used up{tail}"
    for h in held:
        if "spend headroom" in h or "may not scale up" in h or "budget" in h:
            return f"may not grow: held by its budget ({h})"
        if "quota:" in h:
            return f"may not grow: held by its GPU quota ({h})"
    if not isinstance(td, dict):
        return None
    return "may grow" + (f"; {reasons}" if reasons else "")
