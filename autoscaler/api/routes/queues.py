"""Queues: list (with depth, running and oldest wait), get, create (admin)."""

from __future__ import annotations

from fastapi import APIRouter

from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.api.schemas import QueueIn, QueueOut
from autoscaler.errors import Conflict, InvalidInput, NotFound
from autoscaler.queueing.queues import QueueStats, queue_stats, visible_queues
from autoscaler.state.models import QueueRow

router = APIRouter(prefix="/api/v1/queues", tags=["queues"])


def _out(row: QueueRow, stats: QueueStats | None, now_ts: float) -> QueueOut:
    stats = stats or QueueStats(0, 0, None)
    wait = now_ts - stats.oldest_enqueued.timestamp() if stats.oldest_enqueued else None
    return QueueOut(
        name=row.name,
        pools=row.pools,
        priority=row.priority,
        teams=row.teams,
        depth=stats.depth,
        running=stats.running,
        oldest_wait_s=wait,
    )


@router.get("", response_model=list[QueueOut])
def list_queues(auth: Auth, ctx: Ctx) -> list[QueueOut]:
    with tx(ctx) as s:
        principal = auth.user(s)
        team = None if principal.is_admin else principal.team
        stats = queue_stats(s, team=team)
        now = ctx.clock.now().timestamp()
        return [_out(r, stats.get(r.name), now) for r in visible_queues(s, team)]


@router.get("/{name}", response_model=QueueOut)
def get_queue(name: str, auth: Auth, ctx: Ctx) -> QueueOut:
    with tx(ctx) as s:
        principal = auth.user(s)
        team = None if principal.is_admin else principal.team
        row = next((r for r in visible_queues(s, team) if r.name == name), None)
        if row is None:
            raise NotFound(f"queue {name!r} not found")
        return _out(row, queue_stats(s, team=team).get(name), ctx.clock.now().timestamp())


@router.post("", response_model=QueueOut, status_code=201)
def create_queue(body: QueueIn, auth: Auth, ctx: Ctx) -> QueueOut:
    with tx(ctx) as s:
        auth.admin(s)
        unknown = [p for p in body.pools if ctx.config.pool(p) is None]
        if unknown:
            raise InvalidInput(f"unknown pool(s) {unknown}; pools come from the config file")
        if s.get(QueueRow, body.name) is not None:
            raise Conflict(f"queue {body.name!r} already exists")
        row = QueueRow(
            name=body.name, pools=body.pools, priority=body.priority, teams=body.teams, created_at=ctx.clock.now()
        )
        s.add(row)
        return _out(row, None, 0)
