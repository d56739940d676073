"""`TeamAdmission`: one team's standing answer between two policy evaluations. Pure.

It is the policy's `TeamDecision` reduced to what a gate needs, plus the spend
headroom the last plan left (the plan's launches have already used some of it).
The default team's row (name `DEFAULT_TEAM`) answers for teams the policy did not
list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from autoscaler.admission.quota import Quota
from autoscaler.policy.schema import Decision, TeamDecision

DEFAULT_TEAM = ""
# The team a machine is launched for when it is launched for none (a pool's
# `min_instances`, a shared standby machine): the ledger's shared line pays its unused
# time, and under `tenancy: team` it belongs to whichever team holds it now.
SHARED_TEAM = "shared"


def launched_for(team: str | None) -> str | None:
    """The team an instance record says it was launched for; None for none."""
    return None if team is None or team == SHARED_TEAM else team


@dataclass(frozen=True, slots=True)
class TeamAdmission:
    team: str
    may_scale_up: bool = True
    drain: bool = False
    # USD/h of new spend the team may still add until the next evaluation; None: no limit.
    headroom_usd_per_hour: float | None = None
    quota: Quota | None = None
    allowed_pools: tuple[str, ...] | None = None
    allowed_capacity_types: tuple[str, ...] = ("spot", "on_demand")
    priority_tier: int = 0
    priority_weight: float = 1.0
    reasons: tuple[str, ...] = field(default_factory=tuple)
    fail_safe: bool = False

    @property
    def frozen(self) -> bool:
        """No new spend at all: a frozen team may only use what it already pays for."""
        return (
            self.drain
            or not self.may_scale_up
            or (self.headroom_usd_per_hour is not None and self.headroom_usd_per_hour <= 1e-9)
        )


def from_decision(team: str, td: TeamDecision, *, fail_safe: bool = False, headroom_used: float = 0.0) -> TeamAdmission:
    quota = None
    if td.nominal_gpus is not None:
        quota = Quota(td.nominal_gpus, td.borrowing_limit_gpus, td.lending_limit_gpus)
    headroom = td.spend_headroom_per_hour
    if not td.may_scale_up or td.drain:
        headroom = 0.0
    elif headroom is not None:
        headroom = max(headroom - headroom_used, 0.0)
    return TeamAdmission(
        team=team,
        may_scale_up=td.may_scale_up,
        drain=td.drain,
        headroom_usd_per_hour=headroom,
        quota=quota,
        allowed_pools=tuple(td.allowed_pools) if td.allowed_pools is not None else None,
        allowed_capacity_types=tuple(td.allowed_capacity_types),
        priority_tier=td.priority_tier,
        priority_weight=td.priority_weight,
        reasons=tuple(td.reasons),
        fail_safe=fail_safe,
    )


def admissions(decision: Decision, headroom_used: Mapping[str, float]) -> dict[str, TeamAdmission]:
    """Every team's admission from one decision, the default team's under `DEFAULT_TEAM`."""
    out = {
        name: from_decision(name, td, fail_safe=decision.fail_safe, headroom_used=headroom_used.get(name, 0.0))
        for name, td in decision.teams.items()
    }
    out[DEFAULT_TEAM] = from_decision(DEFAULT_TEAM, decision.default_team, fail_safe=decision.fail_safe)
    return out


@dataclass(frozen=True, slots=True)
class AdmissionTable:
    """All teams' admissions, as a gate reads them."""

    teams: Mapping[str, TeamAdmission]

    def of(self, team: str) -> TeamAdmission:
        hit = self.teams.get(team)
        if hit is not None:
            return hit
        default = self.teams.get(DEFAULT_TEAM)
        return TeamAdmission(team) if default is None else replace(default, team=team)

    def quotas(self) -> dict[str, Quota]:
        return {t: a.quota for t, a in self.teams.items() if a.quota is not None and t != DEFAULT_TEAM}
