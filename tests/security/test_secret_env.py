"""Secret task env (`secret_env`): sealed at rest, shown as `***`, opened only for the
worker that leases the task.

- the key ring: AES-GCM values bound to their task and name, rotation (the first key
  seals, every key opens), the key file made 0600 on first start;
- through the real app on both databases: no API response but the lease carries a
  value (enqueue, list, show, cancel, start, finish, why, decisions, metrics, the
  dashboard's pages), no log line at DEBUG does, and neither the SQLite file (with its
  WAL) nor a pg_dump of the PostgreSQL database holds it, after a real reconcile cycle
  has recorded its decision;
- a name in both env and secret_env is refused (422); a value whose key was removed
  fails its task with the reason instead of blocking the queue.
"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.engine import make_url

from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from autoscaler.auth.sealing import (
    MASK,
    SecretKeys,
    SecretUnavailable,
    load_key_file,
    new_key,
    reseal_tasks,
    rotate_key_file,
)
from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from autoscaler.errors import ConfigError
from autoscaler.policy.service import PolicyService
from autoscaler.state.db import transaction
from autoscaler.state.models import Task
from tests.conftest import LiveServer, issue_token
from tests.pgserver import _bindir
from tests.reconciler.harness import make_rig

SECRET = "wandb-Zq8r3VtLk2mN9pX4sW7y"  # distinctive: any occurrence anywhere is a leak
OTHER_SECRET = "hf_Jt6Yc2Bn8Kd4Ls1Qw9Ee"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# -- the key ring ---------------------------------------------------------------------


def test_sealed_values_open_only_for_their_task_and_name() -> None:
    keys = SecretKeys.generate()
    sealed = keys.seal("task-1", "API_KEY", SECRET)
    assert SECRET not in sealed and sealed.startswith("v1." + keys.ids[0] + ".")
    assert keys.seal("task-1", "API_KEY", SECRET) != sealed  # a fresh nonce every time
    assert keys.open("task-1", "API_KEY", sealed) == SECRET
    with pytest.raises(SecretUnavailable, match="does not open"):
        keys.open("task-2", "API_KEY", sealed)  # copied into another task
    with pytest.raises(SecretUnavailable, match="does not open"):
        keys.open("task-1", "OTHER", sealed)  # moved under another name
    tampered = sealed[:-2] + ("AA" if not sealed.endswith("AA") else "BB")
    with pytest.raises(SecretUnavailable):
        keys.open("task-1", "API_KEY", tampered)
    with pytest.raises(SecretUnavailable, match="not in memory"):
        SecretKeys.generate().open("task-1", "API_KEY", sealed)


def test_rotation_first_key_seals_every_key_opens(tmp_path: Path) -> None:
    path = tmp_path / "home" / "secret.key"
    first = load_key_file(path, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key_file(path, create=True).ids == first.ids  # an existing file is kept
    old_value = first.seal("t", "K", SECRET)

    new_id, kept = rotate_key_file(path)
    assert kept == first.ids and stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = load_key_file(path, create=False)
    assert ring.ids == [new_id, *first.ids]
    assert ring.seal("t", "K", SECRET).split(".")[1] == new_id  # new writes: the first key
    assert ring.open("t", "K", old_value) == SECRET  # old values: still open

    # Dropping the old key before resealing: the old value names the missing key.
    path.write_text(new_key() + "\n")
    with pytest.raises(SecretUnavailable, match=first.ids[0]):
        load_key_file(path, create=False).open("t", "K", old_value)


def test_bad_key_files_are_refused_with_the_line(tmp_path: Path) -> None:
    path = tmp_path / "secret.key"
    path.write_text("# comment only\n\n")
    with pytest.raises(ConfigError, match="no secret key"):
        load_key_file(path, create=False)
    path.write_text("# ok\nnot-a-key!!\n")
    with pytest.raises(ConfigError, match=r"secret\.key:2"):
        load_key_file(path, create=False)
    with pytest.raises(ConfigError, match="not found"):
        load_key_file(tmp_path / "missing.key", create=False)


def test_a_worldreadable_key_file_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "secret.key"
    path.write_text(new_key() + "\n")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING):
        load_key_file(path, create=False)
    assert "chmod 600" in caplog.text


# -- through the app, on both databases ------------------------------------------------


def _register(client: TestClient | httpx.Client, admin: str, instance: str, pool: str = "gpu-pool") -> dict[str, Any]:
    join = client.post("/api/v1/tokens", headers=_bearer(admin), json={"kind": "join", "pool": pool}).json()["token"]
    r = client.post(
        "/api/v1/workers/register",
        headers=_bearer(join),
        json={
            "hostname": instance,
            "instance_id": instance,
            "provider": "fake",
            "pool": pool,
            "gpus": [{"index": 0, "model": "A10G"}],
        },
    )
    assert r.status_code == 201, r.text
    return dict(r.json())


def _dashboard(url: str, token: str) -> httpx.Client:
    http = httpx.Client(base_url=url, timeout=10)
    assert http.post("/login", data={"token": token, "next": "/"}).status_code == 303
    return http


def _database_bytes(db_url: str) -> bytes:
    """Everything the database keeps on disk (SQLite: the file and its WAL) or dumps
    (PostgreSQL: pg_dump of the whole database, data and schema)."""
    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        assert url.database
        db = Path(url.database)
        return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))
    plain = url.set(drivername="postgresql").render_as_string(hide_password=False)
    dump = subprocess.run([str(_bindir() / "pg_dump"), "--dbname", plain], capture_output=True, check=True)
    return dump.stdout


def test_secret_env_reaches_only_the_leasing_worker(
    ctx: AppContext,
    db_url: str,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, every level, is checked below
    server = LiveServer(ctx).start()
    try:
        _run_the_whole_story(ctx, db_url, server.url, tmp_path)
    finally:
        server.stop()
    logged = "\n".join(f"{r.name} {r.getMessage()} {r.args!r} {r.exc_text or ''}" for r in caplog.records)
    assert SECRET not in logged and OTHER_SECRET not in logged


def _run_the_whole_story(ctx: AppContext, db_url: str, url: str, tmp_path: Path) -> None:
    http = httpx.Client(base_url=url, timeout=10)
    admin = issue_token(ctx, "admin")
    vision = http.post("/api/v1/tokens", headers=_bearer(admin), json={"kind": "team", "team": "vision"}).json()[
        "token"
    ]
    seen: list[str] = []  # every response body but the lease's

    def call(method: str, path: str, token: str, **kw: Any) -> Any:
        r = http.request(method, path, headers=_bearer(token), **kw)
        assert r.status_code < 300, (path, r.status_code, r.text)
        seen.append(r.text)
        return r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text

    # Refused: one name in both maps (422, and the message does not repeat the value).
    both = http.post(
        "/api/v1/tasks",
        headers=_bearer(vision),
        json={
            "queue": "gpu",
            "command": ["true"],
            "env": {"WANDB_API_KEY": "x"},
            "secret_env": {"WANDB_API_KEY": SECRET},
        },
    )
    assert both.status_code == 422 and "WANDB_API_KEY" in both.text and SECRET not in both.text
    bad_name = http.post(
        "/api/v1/tasks",
        headers=_bearer(vision),
        json={"queue": "gpu", "command": ["true"], "secret_env": {"1BAD": SECRET}},
    )
    assert bad_name.status_code == 422 and SECRET not in bad_name.text

    body = {
        "queue": "gpu",
        "command": ["python", "train.py"],
        "gpus": 1,
        "env": {"EPOCHS": "3"},
        "secret_env": {"WANDB_API_KEY": SECRET, "HF_TOKEN": OTHER_SECRET},
    }
    created = call("POST", "/api/v1/tasks", vision, json=body)
    task_id = created["id"]
    masked = {"WANDB_API_KEY": MASK, "HF_TOKEN": MASK}
    assert created["secret_env"] == masked and created["env"] == {"EPOCHS": "3"}  # plain env stays plain
    assert call("GET", f"/api/v1/tasks/{task_id}", vision)["secret_env"] == masked
    assert call("GET", "/api/v1/tasks", admin)[0]["secret_env"] == masked
    call("GET", f"/api/v1/tasks/{task_id}/why", vision)

    # A real reconcile cycle over this database records its decision (and metrics).
    rig = make_rig(
        ctx.sessions, ctx.config, ManualClock(ctx.clock.now()), PolicyService(ctx.config.policy, isolate=False)
    )
    rig.reconciler().run_cycle()
    assert call("GET", "/api/v1/decisions", admin)
    call("GET", "/metrics", admin)

    # The lease: the worker that leases the task gets the values, once, in the clear.
    worker = _register(http, admin, "i-secret")
    wauth = worker["worker_token"]
    lease = http.post(f"/api/v1/workers/{worker['worker_id']}/lease", headers=_bearer(wauth))
    assert lease.status_code == 200, lease.text
    leased = lease.json()["task"]
    assert leased["id"] == task_id
    assert leased["secret_env"] == {"WANDB_API_KEY": SECRET, "HF_TOKEN": OTHER_SECRET}
    assert leased["env"] == {"EPOCHS": "3"}
    base = f"/api/v1/workers/{worker['worker_id']}/tasks/{task_id}"
    assert call("POST", f"{base}/start", wauth)["secret_env"] == masked
    assert call("GET", f"/api/v1/tasks/{task_id}", admin)["secret_env"] == masked

    # Another worker of the same pool never sees it (the task is taken; its own lease is empty).
    other = _register(http, admin, "i-other")
    assert call("POST", f"/api/v1/workers/{other['worker_id']}/lease", other["worker_token"])["task"] is None

    # The dashboard: every page a user can open, as admin and as the team.
    for token in (admin, vision):
        page = _dashboard(url, token)
        for path in ("/", "/tasks", f"/tasks/{task_id}", "/fleet", "/decisions", "/charts"):
            r = page.get(path)
            assert r.status_code == 200, (path, r.status_code)
            seen.append(r.text)
    detail = _dashboard(url, vision).get(f"/tasks/{task_id}").text
    assert "HF_TOKEN=***" in detail and "WANDB_API_KEY=***" in detail

    assert call("POST", f"{base}/finish", wauth, json={"reason": "exit", "exit_code": 0})["secret_env"] == masked
    second = call("POST", "/api/v1/tasks", vision, json={**body, "queue": "cpu", "gpus": 0})
    assert call("POST", f"/api/v1/tasks/{second['id']}/cancel", vision)["secret_env"] == masked
    rig.reconciler().run_cycle()
    call("GET", "/api/v1/decisions", admin)
    call("GET", "/metrics", admin)

    everything = "\n".join(seen)
    assert SECRET not in everything and OTHER_SECRET not in everything
    # At rest: sealed, in every table and every byte the database keeps.
    with ctx.sessions() as s:
        rows = list(s.scalars(select(Task).where(Task.id.in_([task_id, second["id"]]))))
    assert all(set(t.secret_env or {}) == {"WANDB_API_KEY", "HF_TOKEN"} for t in rows)
    assert all(v.startswith("v1.") for t in rows for v in (t.secret_env or {}).values())
    stored = _database_bytes(db_url)
    assert b"EPOCHS" in stored  # the scan does see the tasks table ...
    assert SECRET.encode() not in stored and OTHER_SECRET.encode() not in stored  # ... and no secret in it


def test_a_secret_whose_key_is_gone_fails_its_task_instead_of_blocking(ctx: AppContext) -> None:
    client = TestClient(create_app(ctx))
    admin = issue_token(ctx, "admin")
    r = client.post(
        "/api/v1/tasks",
        headers=_bearer(admin),
        json={"queue": "gpu", "command": ["true"], "gpus": 1, "secret_env": {"K": SECRET}},
    )
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    ctx.secret_keys = SecretKeys.generate()  # the sealing key was removed from the key file
    worker = _register(client, admin, "i-rotated")
    lease = client.post(f"/api/v1/workers/{worker['worker_id']}/lease", headers=_bearer(worker["worker_token"]))
    assert lease.status_code == 200 and lease.json()["task"] is None
    task = client.get(f"/api/v1/tasks/{task_id}", headers=_bearer(admin)).json()
    assert task["state"] == "failed" and task["end_reason"] == "start_failed"
    assert "secret env cannot be opened" in task["events"][-1]["detail"]
    assert SECRET not in str(task)


def test_a_server_without_a_key_refuses_secret_env_and_stores_nothing(ctx: AppContext) -> None:
    ctx.secret_keys = None
    client = TestClient(create_app(ctx))
    admin = issue_token(ctx, "admin")
    r = client.post(
        "/api/v1/tasks", headers=_bearer(admin), json={"queue": "gpu", "command": ["true"], "secret_env": {"K": SECRET}}
    )
    assert r.status_code == 409 and "secret key" in r.text
    with ctx.sessions() as s:
        assert s.scalars(select(Task)).first() is None


def test_reseal_moves_every_stored_value_to_the_current_key(ctx: AppContext, config: AutoscalerConfig) -> None:
    client = TestClient(create_app(ctx))
    admin = issue_token(ctx, "admin")
    for queue in ("gpu", "cpu"):
        r = client.post(
            "/api/v1/tasks",
            headers=_bearer(admin),
            json={"queue": queue, "command": ["true"], "secret_env": {"K": SECRET}},
        )
        assert r.status_code == 201
    old = ctx.secret_keys
    assert old is not None
    rotated = SecretKeys((os.urandom(32), *old.keys))
    with transaction(ctx.sessions) as s:
        count, used = reseal_tasks(s, rotated)
    assert count == 2 and used == {old.ids[0]}
    only_new = SecretKeys(rotated.keys[:1])
    with ctx.sessions() as s:
        for task in s.scalars(select(Task)):
            assert only_new.open_all(task.id, task.secret_env) == {"K": SECRET}
