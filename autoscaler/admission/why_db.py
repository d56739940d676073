"""Gather the facts `why.explain_task` needs for one task: a handful of small
queries (the admission table, the last decision's holds for the task's team and
queue, booting instances in the queue's pools, the queued tasks ahead of it)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from datetime import datetime

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from autoscaler.admission import right_size
from autoscaler.admission import store as admission_store
from autoscaler.admission.quota import cap
from autoscaler.admission.why import Booting, Spend, TaskFacts, Why, explain_task, standing
from autoscaler.ledger.spend import burn_rate, month_to_date
from autoscaler.lifecycle import INSTANCE_BOOTING
from autoscaler.queueing.tasks import team_usage
from autoscaler.state.models import DecisionRecord, Instance, QueueRow, Task

BOOTING_STATES = INSTANCE_BOOTING
BOOT_HISTORY = 20  # the last N boots of a pool give its typical boot time


def _typical_boot_s(session: Session, pool: str) -> float | None:
    rows = session.execute(
        select(Instance.launched_at, Instance.ready_at)
        .where(Instance.pool == pool, Instance.ready_at.is_not(None), Instance.launched_at.is_not(None))
        .order_by(Instance.ready_at.desc())
        .limit(BOOT_HISTORY)
    ).all()
    spans = [
        (ready - start).total_seconds()
        for start, ready in rows
        if start is not None and ready is not None and ready >= start
    ]
    return statistics.median(spans) if spans else None


def why_task(session: Session, task: Task, *, boot_timeouts: Mapping[str, float], now: datetime) -> Why:
    facts = TaskFacts(
        task.id,
        task.team,
        task.queue,
        task.state,
        task.gpus,
        task.created_at,
        task.worker_id,
        task.started_at,
        task.finished_at,
        task.end_reason,
        task.exit_code,
        task.cpus,
        task.memory_mb,
    )
    if task.state != "queued":
        return explain_task(
            facts,
            admission=None,
            quotas={},
            held_gpus={},
            queue_pools=(),
            holds=(),
            booting=(),
            ahead=0,
            spend=None,
            decided_at=None,
            now=now,
        )
    table = admission_store.load(session)
    adm = table.of(task.team) if table is not None else None
    queue = session.get(QueueRow, task.queue)
    queue_pools = [str(p) for p in (queue.pools or [])] if queue is not None else []

    last = session.scalars(select(DecisionRecord).order_by(DecisionRecord.id.desc()).limit(1)).first()
    holds = []
    if last is not None:
        for h in (last.plan or {}).get("holds") or []:
            if isinstance(h, dict) and h.get("team") == task.team and h.get("queue") == task.queue:
                holds.append(h)

    booting = []
    if queue_pools:
        insts = session.scalars(
            select(Instance)
            .where(Instance.pool.in_(queue_pools), Instance.state.in_(BOOTING_STATES), Instance.gpus >= task.gpus)
            .order_by(Instance.created_at)
            .limit(20)
        )
        typical: dict[str, float | None] = {}
        for inst in insts:
            if inst.pool not in typical:
                typical[inst.pool] = _typical_boot_s(session, inst.pool)
            booting.append(
                Booting(
                    inst.id,
                    inst.pool,
                    inst.state,
                    inst.gpus,
                    inst.launched_at or inst.created_at,
                    boot_timeouts.get(inst.pool, 900.0),
                    inst.hourly_price,
                    inst.team,
                    inst.capacity_type,
                    typical[inst.pool],
                    right_size.from_json(inst.smaller_machines),
                )
            )

    ahead = 0
    if queue_pools:
        # Queues that share a pool with this one compete for the same workers.
        sharing = [q.name for q in session.scalars(select(QueueRow)) if set(q.pools or []) & set(queue_pools)]
        my_prio = queue.priority if queue is not None else 0
        ahead = int(
            session.scalar(
                select(func.count())
                .select_from(Task)
                .join(QueueRow, QueueRow.name == Task.queue)
                .where(
                    Task.state == "queued",
                    Task.queue.in_(sharing),
                    Task.id != task.id,
                    or_(
                        QueueRow.priority > my_prio,
                        and_(QueueRow.priority == my_prio, Task.priority > task.priority),
                        and_(
                            QueueRow.priority == my_prio, Task.priority == task.priority, Task.sort_key < task.sort_key
                        ),
                    ),
                )
            )
            or 0
        )

    spend = None
    if adm is not None and (adm.frozen or adm.headroom_usd_per_hour is not None):
        mtd = month_to_date(session, now, task.team).get(task.team, 0.0)
        spend = Spend(mtd, burn_rate(session, task.team).get(task.team, 0.0))

    held = {t: g for t, (g, _n) in team_usage(session).items()}
    return explain_task(
        facts,
        admission=adm,
        quotas=table.quotas() if table is not None else {},
        held_gpus=held,
        queue_pools=queue_pools,
        holds=holds,
        booting=booting,
        ahead=ahead,
        spend=spend,
        decided_at=last.at if last is not None else None,
        now=now,
    )


def team_standing(session: Session, team: str) -> str | None:
    """The team's current admission in one sentence, or None before any evaluation."""
    table = admission_store.load(session)
    if table is None:
        return None
    held = {t: g for t, (g, _n) in team_usage(session).items()}
    quotas = table.quotas()
    limit = cap(team, quotas, held) if team in quotas else None
    return standing(table.of(team), held.get(team, 0), limit)
