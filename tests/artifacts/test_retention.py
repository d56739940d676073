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
        assert records.prune(s, store, older_than=old + timedelta(days=30)) == 2
    with transaction(ctx.sessions) as s:
        assert [a.attempt for a in s.scalars(select(Artifact))] == [2]
        assert [x.digest for x in s.scalars(select(Snapshot))] == [used.digest]
    assert store.exists(used_key) and not store.exists(unused_key)
    assert not store.exists(records.artifact_key(task.id, 1, "output", "out.txt"))
