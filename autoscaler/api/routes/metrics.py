"""`GET /metrics` in the Prometheus text format.

Access: a bearer token, like every other endpoint. An admin token (what Prometheus
scrapes with, `authorization: {credentials_file: ...}`) sees everything, including
the in-process instruments; a team token sees only its own team's series. No token
is 401: queue names, team names and spend are not public.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.errors import Forbidden
from autoscaler.ledger import shared_pools
from autoscaler.metrics.collector import SnapshotCollector, snapshot_families
from autoscaler.metrics.instruments import PROCESS_REGISTRY
from autoscaler.reports.budgets import team_budgets
from autoscaler.reports.spend import team_spend

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def metrics(auth: Auth, ctx: Ctx) -> Response:
    now = ctx.clock.now()
    with tx(ctx) as s:
        principal = auth.user(s)
        if not principal.is_admin and not principal.team:
            raise Forbidden("this team token names no team")
        team = None if principal.is_admin else principal.team
        spend = team_spend(
            s,
            now=now,
            budgets=team_budgets(ctx.config),
            teams=[t.name for t in ctx.config.teams],
            only_team=team,
            shared=shared_pools(ctx.config),
        )
        families = snapshot_families(s, now=now, spend=spend, team=team, capacity=ctx.config.capacity)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(families))
    body = generate_latest(registry)
    if principal.is_admin:
        body += generate_latest(PROCESS_REGISTRY)
    return Response(content=body, media_type=CONTENT_TYPE_LATEST)
