"""Retention: old artifacts and snapshots are deleted from the store and forgotten;
a snapshot a queued task still names is kept until no live task needs it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from autoscaler.api.context import AppContext
from autoscaler.artifacts import records
from autoscaler.artifacts.store import LocalStore
from autoscaler.queueing import tasks as task_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import Artifact, Snapshot


def test_prune_deletes_old_objects_but_keeps_snapshots_live_tasks_use(ctx: AppContext, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    old = datetime(2026, 1, 1, tzinfo=UTC)
    with transaction(ctx.sessions) as s:
        used_key, unused_key = records.snapshot_key("vision", "sha256:" + "a" * 64), "snapshots/vision/" + "b" * 64
        used = store.put(used_key, [b"used"])
        unused = store.put(unused_key, [b"unused"])
        records.record_snapshot(s, "vision", used_key, used, old)
        records.record_snapshot(s, "vision", unused_key, unused, old)
        task = task_ops.enqueue(
            s, task_ops.TaskSpec(queue="gpu", command=["true"], code={"snapshot": used.digest}), team="vision", now=old
        )
        for attempt, when in ((1, old), (2, old + timedelta(days=60))):
            key = records.artifact_key(task.id, attempt, "output", "out.txt")
            w = store.put(key, [b"o"])
            records.record_artifact(
                s, task_id=task.id, team="vision", attempt=attempt, kind="output", name="out.txt", key=key,
                written=w, now=when,
            )  # fmt: skip
    with transaction(ctx.sessions) as s:
        gone = records.prune(s, older_than=old + timedelta(days=30))
    assert sorted(gone) == sorted([records.artifact_key(task.id, 1, "output", "out.txt"), unused_key])
    assert store.exists(unused_key)  # nothing is deleted before the caller does it
    records.delete_objects(store, gone)
    with transaction(ctx.sessions) as s:
        assert [a.attempt for a in s.scalars(select(Artifact))] == [2]
        assert [x.digest for x in s.scalars(select(Snapshot))] == [used.digest]
    assert store.exists(used_key) and not store.exists(unused_key)
    assert not store.exists(records.artifact_key(task.id, 1, "output", "out.txt"))


class CommittedFirstStore(LocalStore):
    """A store that, at each delete, looks from another connection for a row still
    naming the object: what a reader would find if the delete ran inside the transaction
    that forgets the row (and what a slow store would hold the write lock for)."""

    def __init__(self, root: Path, ctx: AppContext) -> None:
        super().__init__(root)
        self.ctx = ctx
        self.named_when_deleted: list[str] = []

    def delete(self, key: str) -> None:
        with transaction(self.ctx.sessions) as s:
            named = s.scalar(select(Artifact.key).where(Artifact.key == key)) or s.scalar(
                select(Snapshot.key).where(Snapshot.key == key)
            )
        if named is not None:
            self.named_when_deleted.append(key)
        super().delete(key)


def test_the_retention_job_deletes_objects_only_after_the_commit_that_forgot_them(
    ctx: AppContext, tmp_path: Path
) -> None:
    store = CommittedFirstStore(tmp_path / "store", ctx)
    old = datetime(2026, 1, 1, tzinfo=UTC)
    with transaction(ctx.sessions) as s:
        snap_key = "snapshots/vision/" + "c" * 64
        records.record_snapshot(s, "vision", snap_key, store.put(snap_key, [b"code"]), old)
        task = task_ops.enqueue(s, task_ops.TaskSpec(queue="gpu", command=["true"]), team="vision", now=old)
        out_key = records.artifact_key(task.id, 1, "output", "out.txt")
        records.record_artifact(
            s, task_id=task.id, team="vision", attempt=1, kind="output", name="out.txt", key=out_key,
            written=store.put(out_key, [b"o"]), now=old,
        )  # fmt: skip
    assert records.expire(ctx.sessions, store, older_than=old + timedelta(days=30)) == 2
    assert store.named_when_deleted == []
    assert not store.exists(snap_key) and not store.exists(out_key)
    with transaction(ctx.sessions) as s:
        assert s.scalar(select(Artifact.key)) is None and s.scalar(select(Snapshot.key)) is None
