"""What the database keeps of stored objects: the snapshots each team uploaded and
the artifacts each task's attempts left, with the store keys they live under.

Keys are built here from ids the server made (team names, task ids, digests), never
from a path a client sent, so no request can name an object outside its own task or
team. Names a task gives its outputs are kept in the row, not in the key.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import NamedTuple

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.artifacts.store import ArtifactStore, Written
from autoscaler.queueing.states import ACTIVE, TaskState
from autoscaler.state.db import transaction
from autoscaler.state.models import Artifact, Snapshot, Task

KINDS = ("output", "checkpoint")
CHECKPOINT_NAME = "checkpoint.tar.gz"


def snapshot_key(team: str, digest: str) -> str:
    return f"snapshots/{team}/{digest.removeprefix('sha256:')}"


def artifact_key(task_id: str, attempt: int, kind: str, name: str, generation: int = 0, *, upload: str = "") -> str:
    """Where one upload of an artifact is stored. `upload` (see `upload_id`) makes the key
    the upload's own, so two uploads of the same artifact in flight at once never write
    one object: the row recorded last names the bytes that were sent with it."""
    # The name is hashed: it is the task's choice and may hold anything a path can.
    base = f"tasks/{task_id}/{attempt}/{kind}/{hashlib.sha256(name.encode()).hexdigest()[:40]}"
    base = f"{base}.g{generation}" if generation else base
    return f"{base}.u{upload}" if upload else base


def upload_id() -> str:
    return secrets.token_hex(8)


class AlreadyStored(Exception):
    """A write-once version (a gang's checkpoint generation) is already recorded."""


class Recorded(NamedTuple):
    artifact: Artifact
    replaced_key: str | None  # the object the new row replaced: the caller deletes it after commit


def rank_name(rank: int | None, name: str) -> str:
    """What a gang's rank's artifact is called: under `rank-R/` (a single task's: as is)."""
    return name if rank is None else f"rank-{rank}/{name}"


def record_snapshot(session: Session, team: str, key: str, written: Written, now: datetime) -> Snapshot:
    row = session.get(Snapshot, (team, written.digest))
    if row is None:
        row = Snapshot(team=team, digest=written.digest, size=written.size, key=key, created_at=now)
        session.add(row)
    else:
        row.created_at = now  # uploaded again: its retention starts over
    session.flush()
    return row


def find_snapshot(session: Session, team: str, digest: str) -> Snapshot | None:
    return session.get(Snapshot, (team, digest))


def record_artifact(
    session: Session,
    *,
    task_id: str,
    team: str,
    attempt: int,
    kind: str,
    name: str,
    key: str,
    written: Written,
    now: datetime,
    rank: int | None = None,
    generation: int = 0,
) -> Recorded:
    """Add the artifact, or replace its attempt's earlier version (generation 0: a single
    task's output or periodic checkpoint, the newest wins). A gang's generation (> 0) is
    write-once: a second upload of it raises AlreadyStored, also when both raced past
    the route's early check (the unique index decides; a savepoint keeps the
    transaction usable on PostgreSQL)."""
    row = find_version(session, task_id, name, attempt, generation)
    if row is None:
        try:
            with session.begin_nested():
                row = Artifact(task_id=task_id, team=team, name=name, attempt=attempt, rank=rank, generation=generation)
                row.kind, row.key, row.size, row.digest, row.created_at = kind, key, written.size, written.digest, now
                session.add(row)
            return Recorded(row, None)
        except IntegrityError:
            row = find_version(session, task_id, name, attempt, generation)  # the concurrent upload won
            if row is None:
                raise
    if generation:
        raise AlreadyStored(f"generation {generation} of {name} of attempt {attempt} is already stored")
    replaced = row.key if row.key != key else None
    row.kind, row.key, row.size, row.digest, row.created_at = kind, key, written.size, written.digest, now
    session.flush()
    return Recorded(row, replaced)


def find_version(session: Session, task_id: str, name: str, attempt: int, generation: int) -> Artifact | None:
    return session.scalars(
        select(Artifact).where(
            Artifact.task_id == task_id,
            Artifact.name == name,
            Artifact.attempt == attempt,
            Artifact.generation == generation,
        )
    ).first()


def list_artifacts(session: Session, task_id: str) -> list[Artifact]:
    return list(
        session.scalars(
            select(Artifact)
            .where(Artifact.task_id == task_id)
            .order_by(Artifact.attempt, Artifact.name, Artifact.generation)
        )
    )


def find_artifact(
    session: Session, task_id: str, name: str, attempt: int | None = None, generation: int | None = None
) -> Artifact | None:
    """The named artifact of that attempt, or of the latest attempt that left one (of
    that generation, or its latest)."""
    stmt = select(Artifact).where(Artifact.task_id == task_id, Artifact.name == name)
    if attempt is not None:
        stmt = stmt.where(Artifact.attempt == attempt)
    if generation is not None:
        stmt = stmt.where(Artifact.generation == generation)
    return session.scalars(stmt.order_by(Artifact.attempt.desc(), Artifact.generation.desc()).limit(1)).first()


def latest_checkpoint(session: Session, task_id: str) -> Artifact | None:
    """What the next attempt starts from: the checkpoint of the latest attempt that saved one."""
    stmt = select(Artifact).where(Artifact.task_id == task_id, Artifact.kind == "checkpoint")
    return session.scalars(stmt.order_by(Artifact.attempt.desc(), Artifact.created_at.desc()).limit(1)).first()


def prune(session: Session, *, older_than: datetime) -> list[str]:
    """Retention: forget artifacts and snapshots stored before `older_than`; returns their
    store keys, for the caller to delete once the transaction has committed (no store
    call inside a transaction: a slow store would hold the database's write lock; a
    file whose delete fails is an orphan in the store, never a row pointing at nothing).

    A snapshot still named by a queued or running task is kept (deleting it would fail
    the task's next attempt); it ages out once no such task is left."""
    gone: list[str] = []
    for art in list(session.scalars(select(Artifact).where(Artifact.created_at < older_than))):
        gone.append(art.key)
        session.delete(art)
    live_states = [s.value for s in ACTIVE] + [TaskState.QUEUED.value]
    in_use = {
        (t.team, str((t.code or {}).get(field) or ""))
        for t in session.scalars(select(Task).where(Task.state.in_(live_states), Task.code.is_not(None)))
        for field in ("snapshot", "diff_snapshot")
    }
    for snap in list(session.scalars(select(Snapshot).where(Snapshot.created_at < older_than))):
        if (snap.team, snap.digest) in in_use:
            continue
        gone.append(snap.key)
        session.execute(delete(Snapshot).where(Snapshot.team == snap.team, Snapshot.digest == snap.digest))
    session.flush()
    return gone


def expire(sessions: sessionmaker[Session], store: ArtifactStore, *, older_than: datetime) -> int:
    """The retention job: forget what is older than `older_than`, commit, then delete
    the objects. Returns how many were forgotten."""
    with transaction(sessions) as s:
        gone = prune(s, older_than=older_than)
    delete_objects(store, gone)
    return len(gone)


def delete_objects(store: ArtifactStore, keys: list[str]) -> None:
    """Delete the objects of forgotten rows, after the commit that forgot them."""
    for key in keys:
        store.delete(key)
