"""Read-only views of the fleet: pools, instances and reconcile decisions.

Team members see pools and the instances launched for their team; decisions hold
every team's figures, so a team token reads only its own part of each
(`reconciler.team_view`): its policy answer, holds, launches and alerts.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.api.schemas import DecisionOut, InstanceOut, PoolOut
from autoscaler.auth.tokens import Principal
from autoscaler.config import AutoscalerConfig
from autoscaler.errors import NotFound
from autoscaler.lifecycle import INSTANCE_LISTED
from autoscaler.reconciler.team_view import team_decision
from autoscaler.state.models import DecisionRecord, Instance

router = APIRouter(prefix="/api/v1", tags=["fleet"])
LIVE_INSTANCE_STATES = INSTANCE_LISTED


@router.get("/pools", response_model=list[PoolOut])
def pools(auth: Auth, ctx: Ctx) -> list[PoolOut]:
    with tx(ctx) as s:
        auth.user(s)
        counts = dict(
            s.execute(
                select(Instance.pool, func.count())
                .where(Instance.state.in_(LIVE_INSTANCE_STATES))
                .group_by(Instance.pool)
            ).all()
        )
    return [
        PoolOut(
            name=p.name,
            provider=p.provider,
            region=p.region,
            zones=p.zones,
            capacity_types=list(p.capacity_types),
            min_instances=p.min_instances,
            max_instances=p.max_instances,
            idle_timeout_s=p.idle_timeout_s,
            warm_pool=p.warm_pool,
            boot_timeout_s=p.boot_timeout_s,
            instances=counts.get(p.name, 0),
        )
        for p in ctx.config.pools
    ]


@router.get("/instances", response_model=list[InstanceOut])
def instances(
    auth: Auth,
    ctx: Ctx,
    pool: str | None = None,
    state: str | None = None,
    include_terminated: bool = False,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> list[Instance]:
    with tx(ctx) as s:
        principal = auth.user(s)
        stmt = select(Instance).order_by(Instance.created_at.desc()).limit(limit)
        if not principal.is_admin:
            stmt = stmt.where(Instance.team == principal.team)
        if pool:
            _check_pool(s, ctx.config, pool)
            stmt = stmt.where(Instance.pool == pool)
        if state:
            stmt = stmt.where(Instance.state == state)
        elif not include_terminated:
            stmt = stmt.where(Instance.state.in_(LIVE_INSTANCE_STATES))
        return list(s.scalars(stmt))


def _check_pool(session: Session, config: AutoscalerConfig, pool: str) -> None:
    """Refuse a `pool` filter naming no pool: not in the config, and no instance ever
    launched in it (a pool since removed from the config still lists its instances)."""
    if config.pool(pool) is not None or session.scalar(select(exists().where(Instance.pool == pool))):
        return
    known = ", ".join(p.name for p in config.pools) or "none"
    raise NotFound(
        f"pool {pool[:64]!r} is not configured (known: {known}): check the spelling; pools come from "
        "pools: in autoscaler.yaml (`autoscaler instances` without --pool lists every instance)"
    )


def _scoped(row: DecisionRecord, principal: Principal) -> DecisionOut:
    out = DecisionOut.model_validate(row)
    if principal.is_admin:
        return out
    return DecisionOut.model_validate(team_decision(out.model_dump(), principal.team or ""))


@router.get("/decisions", response_model=list[DecisionOut])
def decisions(auth: Auth, ctx: Ctx, limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> list[DecisionOut]:
    with tx(ctx) as s:
        principal = auth.user(s)
        rows = s.scalars(select(DecisionRecord).order_by(DecisionRecord.id.desc()).limit(limit))
        return [_scoped(r, principal) for r in rows]


@router.get("/decisions/{decision_id}", response_model=DecisionOut)
def decision(
    # Bounded: an id past 64 bits would overflow the database driver (a 500), not miss (a 404).
    decision_id: Annotated[int, Path(ge=1, le=2**63 - 1)],
    auth: Auth,
    ctx: Ctx,
) -> DecisionOut:
    with tx(ctx) as s:
        principal = auth.user(s)
        row = s.get(DecisionRecord, decision_id)
        if row is None:
            raise NotFound(f"decision {decision_id} not found")
        return _scoped(row, principal)
