"""A gang's checkpoints: which set the next attempt restores, and which may go.

Each rank of a multi-node task uploads its own checkpoint (`rank-R/checkpoint.tar.gz`),
numbered by its generation: the k-th checkpoint point of the attempt's schedule (the
agent numbers them from the attempt's start, see autoscaler.agent.carry), so the k-th
of every rank is taken at about the same time. A generation is *complete* when all N
ranks' uploads of it committed. The next attempt restores the latest complete
generation, by (attempt, generation): rank R gets rank R's file of it. A generation
some rank never stored (its agent died, its upload failed) is never restored, so the
ranks never resume from a mismatched set (docs/gangs.md, "Checkpoints").

The set an attempt restores is pinned when the attempt's gang is complete (`as_of`, the
N-th rank's reservation): each rank is handed its files on its own lease, and a rank
of the attempt before, still stopping, may complete a newer generation in between.
Older generations are deleted once a newer one is complete, except the pinned set of
the attempt that is starting or running now.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.lifecycle import RANK_ACTIVE
from autoscaler.state.models import Artifact, Task, TaskRank

Generation = tuple[int, int]  # (attempt, generation): later attempts' are newer


def _by_generation(session: Session, task_id: str) -> dict[Generation, list[Artifact]]:
    rows = session.scalars(
        select(Artifact).where(Artifact.task_id == task_id, Artifact.kind == "checkpoint", Artifact.rank.is_not(None))
    )
    out: dict[Generation, list[Artifact]] = defaultdict(list)
    for row in rows:
        out[(row.attempt, row.generation)].append(row)
    return out


def _latest_complete(groups: dict[Generation, list[Artifact]], nodes: int, as_of: datetime | None) -> Generation | None:
    everyone = set(range(nodes))
    complete = [
        gen
        for gen, rows in groups.items()
        if {r.rank for r in rows if as_of is None or r.created_at <= as_of} >= everyone
    ]
    return max(complete, default=None)


def restore_set(session: Session, task: Task, *, as_of: datetime | None) -> dict[int, Artifact]:
    """Rank -> its checkpoint of the latest generation all ranks had committed by
    `as_of` (None: by now); empty when no generation is complete."""
    groups = _by_generation(session, task.id)
    gen = _latest_complete(groups, task.nodes, as_of)
    if gen is None:
        return {}
    return {r.rank: r for r in groups[gen] if r.rank is not None and r.rank < task.nodes}


def pinned_at(session: Session, task: Task) -> datetime | None:
    """When the gang's current attempt was complete (its N-th rank reserved), which
    fixes the set its ranks restore; None while it forms or when none is live."""
    live = [s.value for s in RANK_ACTIVE]
    ranks = list(
        session.scalars(
            select(TaskRank).where(
                TaskRank.task_id == task.id, TaskRank.attempt == task.attempts, TaskRank.state.in_(live)
            )
        )
    )
    if len(ranks) < task.nodes:
        return None
    return max(r.reserved_at for r in ranks)


def prune(session: Session, task: Task) -> list[str]:
    """Forget the generations older than the latest complete one, except the set the
    live attempt restores; returns the store keys of the forgotten files, for the caller
    to delete once the transaction has committed (no store call inside a transaction;
    a file whose delete fails is an orphan in the store, never a row pointing at nothing).
    Incomplete newer generations stay: their missing ranks may still store them."""
    groups = _by_generation(session, task.id)
    latest = _latest_complete(groups, task.nodes, None)
    if latest is None:
        return []
    pin = pinned_at(session, task)
    keep = _latest_complete(groups, task.nodes, pin) if pin is not None else None
    gone: list[str] = []
    for gen, rows in groups.items():
        if gen >= latest or gen == keep:
            continue
        for row in rows:
            gone.append(row.key)
            session.delete(row)
    session.flush()
    return gone
