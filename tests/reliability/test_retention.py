"""Retention (issue 23 item 12): the prune deletes only what is older than each setting,
never a task row, its attempts or the output of a task still running; 0 keeps forever;
the server prunes at start (a real process), and `autoscaler db prune` does it once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import yaml
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig, RetentionConfig, parse_config
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing.queues import sync_from_config
from autoscaler.state.db import make_engine, session_factory, sqlite_url, transaction, upgrade
from autoscaler.state.models import (
    Base,
    DecisionRecord,
    GpuSample,
    HistoryPoint,
    Task,
    TaskEvent,
    TaskLog,
)
from autoscaler.state.retention import prune
from tests.conftest import REPO, TEST_CONFIG, free_port

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=100)  # older than every default
RECENT = NOW - timedelta(days=1)  # younger than every default


def _task(s: Session, config: AutoscalerConfig, *, state: str, finished_at: datetime | None) -> str:
    task = task_ops.enqueue(s, task_ops.TaskSpec(queue="gpu", command=["x"], gpus=1), team="vision", now=OLD)
    task.state, task.finished_at = state, finished_at
    s.add(TaskLog(task_id=task.id, attempt=1, stream="stdout", data="out", at=OLD))
    s.add(TaskEvent(task_id=task.id, at=OLD, from_state="running", to_state=state, reason="r", attempt=1))
    return task.id


def _fill(sessions: sessionmaker[Session], config: AutoscalerConfig) -> dict[str, str]:
    with transaction(sessions) as s:
        sync_from_config(s, config, now=OLD)
        ids = {
            "old_done": _task(s, config, state="succeeded", finished_at=OLD),
            "new_done": _task(s, config, state="failed", finished_at=RECENT),
            "old_running": _task(s, config, state="running", finished_at=None),
        }
        for at in (OLD, RECENT):
            s.add(DecisionRecord(at=at, reasons=[], plan={}, result={}))
            s.add(HistoryPoint(at=at, metric="fleet_instances", key="", value=1.0))
            s.add(GpuSample(worker_id="w", at=at, gpu_index=0, utilization_pct=1, memory_used_mb=1, memory_total_mb=2))
    return ids


def _count(s: Session, model: type[Base], **where: str) -> int:
    stmt = select(func.count()).select_from(model)
    for k, v in where.items():
        stmt = stmt.where(getattr(model, k) == v)
    return int(s.scalar(stmt) or 0)


def test_prune_deletes_only_what_is_older_than_kept(sessions: sessionmaker[Session], config: AutoscalerConfig) -> None:
    ids = _fill(sessions, config)
    with transaction(sessions) as s:
        pruned = prune(s, RetentionConfig(), now=NOW)
    # the old finished task's output chunk and both its events (queued, then its end)
    assert (pruned.task_logs, pruned.task_events, pruned.decisions, pruned.metrics, pruned.gpu_samples) == (
        1,
        2,
        1,
        1,
        1,
    )
    with transaction(sessions) as s:
        assert _count(s, TaskLog, task_id=ids["old_done"]) == 0 and _count(s, TaskEvent, task_id=ids["old_done"]) == 0
        for kept in ("new_done", "old_running"):  # finished recently, or not finished at all
            assert _count(s, TaskLog, task_id=ids[kept]) == 1 and _count(s, TaskEvent, task_id=ids[kept]) == 2
        assert _count(s, Task) == 3  # task rows stay (costs, reports)
        for model in (DecisionRecord, HistoryPoint, GpuSample):
            assert [r.at for r in s.scalars(select(model))] == [RECENT]
    with transaction(sessions) as s:
        assert prune(s, RetentionConfig(), now=NOW).total() == 0  # idempotent


def test_zero_days_keeps_forever_and_short_settings_reach_recent_rows(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    _fill(sessions, config)
    forever = RetentionConfig(
        task_logs_days=0, task_events_days=0, decisions_days=0, metrics_days=0, gpu_samples_days=0
    )
    with transaction(sessions) as s:
        assert prune(s, forever, now=NOW).total() == 0
    half_day = RetentionConfig(decisions_days=0.5, metrics_days=0, gpu_samples_days=0, task_logs_days=0.5)
    with transaction(sessions) as s:
        pruned = prune(s, half_day, now=NOW)
    assert (pruned.decisions, pruned.metrics, pruned.gpu_samples, pruned.task_logs, pruned.task_events) == (
        2,
        0,
        0,
        2,
        2,
    )


def test_server_prunes_at_start_and_db_prune_does_it_once(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    cfg = yaml.safe_load(TEST_CONFIG)
    cfg["retention"] = {"decisions_days": 2}
    config_path = tmp_path / "autoscaler.yaml"
    config_path.write_text(yaml.safe_dump(cfg))
    engine = make_engine(sqlite_url(home))
    upgrade(engine)
    sessions = session_factory(engine)
    now = datetime.now(UTC)
    with transaction(sessions) as s:
        for days in (10, 3, 1):
            s.add(DecisionRecord(at=now - timedelta(days=days), reasons=[], plan={}, result={}))

    def decisions() -> int:
        with transaction(sessions) as s:
            return _count(s, DecisionRecord)

    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autoscaler",
                "server",
                "-c",
                str(config_path),
                "--home",
                str(home),
                "--port",
                str(port),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    try:
        deadline = time.monotonic() + 60
        while decisions() != 1 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.3)
        assert decisions() == 1, log.read_text()  # only the 1-day-old one is left
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    assert "retention: deleted 0 task log chunk(s), 0 task event(s), 2 decision(s)" in log.read_text()

    with transaction(sessions) as s:
        s.add(DecisionRecord(at=now - timedelta(days=5), reasons=[], plan={}, result={}))
    r = subprocess.run(
        [sys.executable, "-m", "autoscaler", "db", "prune", "-c", str(config_path), "--home", str(home)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert r.returncode == 0 and "1 decision(s)" in r.stdout, r.stdout + r.stderr
    assert decisions() == 1
    empty = subprocess.run(
        [sys.executable, "-m", "autoscaler", "db", "prune", "--home", str(tmp_path / "nothing")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert empty.returncode == 1 and "cannot open the database" in empty.stderr and "Traceback" not in empty.stderr
    (tmp_path / "bare").mkdir()
    bare = subprocess.run(
        [sys.executable, "-m", "autoscaler", "db", "prune", "--home", str(tmp_path / "bare")],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=60,
    )
    assert bare.returncode == 1 and "no autoscaler tables yet" in bare.stderr and "Traceback" not in bare.stderr
    engine.dispose()


def test_retention_settings_are_checked() -> None:
    bad = TEST_CONFIG + "retention: {decisions_days: -1}\n"
    try:
        parse_config(bad, Path("t.yaml"))
    except Exception as exc:  # ConfigError, with the field named
        assert "retention.decisions_days" in str(exc)
    else:
        raise AssertionError("a negative retention was accepted")
