"""Queued tasks that no pool of their queue can run any more, after a config change.

Enqueue refuses such a task outright (`admission.shapes`); one queued before the config
changed stays `queued` (the state machine is unchanged) with `unschedulable_reason`
set, which its team sees in `task show`, the API and the task page, and which keeps
it out of the planner's demand. A later config that can run it clears the reason, and
so does a lease (a machine that registered with a bigger shape than the config
declares): the check runs over the distinct queued shapes, a few rows however many
tasks wait, at server start and then about once a minute.
"""

from __future__ import annotations

import logging

from sqlalchemy import ColumnElement, and_, func, select, update
from sqlalchemy.orm import Session

from autoscaler.admission.fit import Need
from autoscaler.admission.shapes import Catalog
from autoscaler.queueing.states import ACTIVE, TaskState
from autoscaler.state.models import QueueRow, Task

log = logging.getLogger(__name__)
MAX_REASON = 500


def review_queued(session: Session, catalog: Catalog) -> dict[str, int]:
    """Set or clear `unschedulable_reason` on queued tasks; the counts changed each way."""
    pools = {q.name: list(q.pools or []) for q in session.scalars(select(QueueRow))}
    marked = cleared = 0
    groups = session.execute(
        select(Task.queue, Task.gpus, Task.gpu_type, Task.cpus, Task.memory_mb, Task.unschedulable_reason, func.count())
        .where(Task.state == TaskState.QUEUED.value)
        .group_by(Task.queue, Task.gpus, Task.gpu_type, Task.cpus, Task.memory_mb, Task.unschedulable_reason)
    ).all()
    for queue, gpus, gpu_type, cpus, memory_mb, current, n in groups:
        need = Need(gpus=int(gpus or 0), gpu_type=gpu_type, cpus=float(cpus or 0.0), memory_mb=int(memory_mb or 0))
        reason = catalog.refusal(queue, pools.get(queue, []), need)
        reason = reason[:MAX_REASON] if reason else None
        if reason == current:
            continue
        match: list[ColumnElement[bool]] = [
            Task.state == TaskState.QUEUED.value,
            Task.queue == queue,
            Task.gpus == gpus,
            Task.gpu_type.is_(None) if gpu_type is None else Task.gpu_type == gpu_type,
            Task.cpus == cpus,
            Task.memory_mb == memory_mb,
            Task.unschedulable_reason.is_(None) if current is None else Task.unschedulable_reason == current,
        ]
        session.execute(
            update(Task)
            .where(and_(*match))
            .values(unschedulable_reason=reason)
            .execution_options(synchronize_session=False)
        )
        if reason is None:
            cleared += int(n)
        else:
            marked += int(n)
            log.warning("%d queued task(s) in queue %s are unschedulable: %s", n, queue, reason)
    # A task that got leased after all is not unschedulable.
    result = session.execute(
        update(Task)
        .where(Task.state.in_([s.value for s in ACTIVE]), Task.unschedulable_reason.is_not(None))
        .values(unschedulable_reason=None)
        .execution_options(synchronize_session=False)
    )
    cleared += int(getattr(result, "rowcount", 0) or 0)
    if cleared:
        log.info("%d task(s) are schedulable again", cleared)
    return {"marked": marked, "cleared": cleared}
