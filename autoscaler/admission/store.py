"""The `team_admission` table: written once per policy evaluation, read by leases.

`write` replaces every row in the cycle's record transaction; `load` reads them in
the lease transaction (a handful of rows: one per team). `spend_headroom` takes what
a lease adds from the team's row under a row lock, so concurrent leases on
PostgreSQL cannot both spend the last dollar.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autoscaler.admission.model import DEFAULT_TEAM, AdmissionTable, TeamAdmission
from autoscaler.admission.quota import Quota
from autoscaler.state.models import TeamAdmissionRow


def _row(adm: TeamAdmission, now: datetime) -> TeamAdmissionRow:
    q = adm.quota
    return TeamAdmissionRow(
        team=adm.team,
        may_scale_up=adm.may_scale_up,
        drain=adm.drain,
        fail_safe=adm.fail_safe,
        headroom_usd_per_hour=adm.headroom_usd_per_hour,
        nominal_gpus=q.nominal_gpus if q else None,
        borrowing_limit_gpus=q.borrowing_limit_gpus if q else None,
        lending_limit_gpus=q.lending_limit_gpus if q else None,
        allowed_pools=list(adm.allowed_pools) if adm.allowed_pools is not None else None,
        allowed_capacity_types=list(adm.allowed_capacity_types),
        priority_tier=adm.priority_tier,
        priority_weight=adm.priority_weight,
        reasons=list(adm.reasons),
        decided_at=now,
    )


def _admission(row: TeamAdmissionRow) -> TeamAdmission:
    quota = None
    if row.nominal_gpus is not None:
        quota = Quota(row.nominal_gpus, row.borrowing_limit_gpus, row.lending_limit_gpus)
    return TeamAdmission(
        team=row.team,
        may_scale_up=row.may_scale_up,
        drain=row.drain,
        headroom_usd_per_hour=row.headroom_usd_per_hour,
        quota=quota,
        allowed_pools=tuple(row.allowed_pools) if row.allowed_pools is not None else None,
        allowed_capacity_types=tuple(row.allowed_capacity_types or ()),
        priority_tier=row.priority_tier,
        priority_weight=row.priority_weight,
        reasons=tuple(row.reasons or ()),
        fail_safe=row.fail_safe,
    )


def write(session: Session, table: Mapping[str, TeamAdmission], *, now: datetime) -> None:
    """Replace the whole table with this evaluation's answers."""
    session.execute(delete(TeamAdmissionRow))
    session.add_all(_row(adm, now) for adm in table.values())


def load(session: Session) -> AdmissionTable | None:
    """The last evaluation's admissions, or None before the first one (then nothing
    has been decided and the gates admit by the default, permissive answer)."""
    rows = list(session.scalars(select(TeamAdmissionRow)))
    if not rows:
        return None
    return AdmissionTable({r.team: _admission(r) for r in rows})


def spend_headroom(session: Session, adm: TeamAdmission, usd_per_hour: float, *, now: datetime) -> bool:
    """Take `usd_per_hour` from the team's headroom, or return False if what is left
    under the row lock is less (another lease spent it since `adm` was read). A team
    answered by the default row gets a row of its own: each such team has its own
    headroom."""
    if usd_per_hour <= 1e-12 or adm.headroom_usd_per_hour is None:
        return True
    row = session.scalar(select(TeamAdmissionRow).where(TeamAdmissionRow.team == adm.team).with_for_update())
    if row is None:
        row = _row(adm, now)
        session.add(row)
    left = row.headroom_usd_per_hour
    if left is None:
        return True
    if usd_per_hour > left + 1e-9:
        return False
    row.headroom_usd_per_hour = max(left - usd_per_hour, 0.0)
    return True


__all__ = ["DEFAULT_TEAM", "load", "spend_headroom", "write"]
