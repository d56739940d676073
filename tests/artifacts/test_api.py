"""Snapshots, artifacts and transfers through the real server (uvicorn on 127.0.0.1,
real database, local store): digests, team isolation, tickets that die with the attempt."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoscaler.api.context import AppContext
from autoscaler.artifacts.store import LocalStore
from tests.conftest import LiveServer, issue_token


def tgz(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def store_ctx(ctx: AppContext, tmp_path: Path) -> AppContext:
    ctx.artifacts = LocalStore(tmp_path / "store")
    return ctx


@pytest.fixture
def server(store_ctx: AppContext) -> Iterator[LiveServer]:
    s = LiveServer(store_ctx).start()
    yield s
    s.stop()


# The server is a thread of the test process: beside other xdist workers on a loaded
# 2-core machine one answer took over 10 s (a lease in test_gang_transfers.py).
HTTP_TIMEOUT_S = 30


def client(server: LiveServer, token: str) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=HTTP_TIMEOUT_S)


def team(server: LiveServer, name: str) -> httpx.Client:
    return client(server, issue_token(server.ctx, "team", team=name))


def upload(c: httpx.Client, body: bytes) -> dict[str, Any]:
    r = c.post("/api/v1/snapshots", content=body, headers={"Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    data: dict[str, Any] = r.json()
    return data


def worker(server: LiveServer) -> tuple[str, httpx.Client]:
    join = issue_token(server.ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
    body = {"hostname": "h", "instance_id": "i-art", "provider": "static", "pool": "gpu-pool"}
    r = httpx.post(
        f"{server.url}/api/v1/workers/register",
        json=body,
        headers={"Authorization": f"Bearer {join}"},
        timeout=HTTP_TIMEOUT_S,
    )
    assert r.status_code == 201, r.text
    return r.json()["worker_id"], client(server, r.json()["worker_token"])


def test_snapshot_answers_the_digest_of_its_bytes(server: LiveServer) -> None:
    body = tgz({"main.py": b"print('hi')\n"})
    got = upload(team(server, "vision"), body)
    assert got == {"digest": "sha256:" + hashlib.sha256(body).hexdigest(), "size": len(body)}


def test_snapshot_larger_than_the_limit_is_refused_and_not_kept(server: LiveServer) -> None:
    server.ctx.config.artifacts.max_snapshot_bytes = 1000
    r = team(server, "vision").post("/api/v1/snapshots", content=b"x" * 5000)
    assert r.status_code == 413 and "1000 bytes" in r.json()["detail"]
    store = server.ctx.artifacts
    assert isinstance(store, LocalStore)
    assert not [p for p in store.root.rglob("*") if p.is_file()]


def test_empty_snapshot_is_refused(server: LiveServer) -> None:
    r = team(server, "vision").post("/api/v1/snapshots", content=b"")
    assert r.status_code == 422 and "empty" in r.json()["detail"]


def test_a_team_cannot_run_another_teams_snapshot(server: LiveServer) -> None:
    digest = upload(team(server, "vision"), tgz({"a": b"1"}))["digest"]
    task = {"queue": "gpu", "command": ["true"], "gpus": 1, "code": {"snapshot": digest}}
    r = team(server, "nlp").post("/api/v1/tasks", json=task)
    assert r.status_code == 404 and "not uploaded by team nlp" in r.json()["detail"]
    assert team(server, "vision").post("/api/v1/tasks", json=task).status_code == 201


def test_an_admin_uploads_for_the_team_it_enqueues_for_and_a_team_only_for_itself(server: LiveServer) -> None:
    body = tgz({"a": b"2"})
    admin = client(server, issue_token(server.ctx, "admin"))
    r = admin.post("/api/v1/snapshots?team=vision", content=body, headers={"Content-Type": "application/gzip"})
    assert r.status_code == 201, r.text
    task = {"queue": "gpu", "command": ["true"], "gpus": 1, "code": {"snapshot": r.json()["digest"]}}
    assert admin.post("/api/v1/tasks", json={**task, "team": "vision"}).status_code == 201
    # Uploaded for vision, so not the admin's catch-all team's (nor nlp's).
    assert admin.post("/api/v1/tasks", json=task).status_code == 404
    other = team(server, "nlp").post(
        "/api/v1/snapshots?team=vision", content=body, headers={"Content-Type": "application/gzip"}
    )
    assert other.status_code == 403 and "cannot upload a snapshot for team vision" in other.json()["detail"]
    nosuch = admin.post("/api/v1/snapshots?team=nosuch", content=body, headers={"Content-Type": "application/gzip"})
    assert nosuch.status_code in (404, 422) and "nosuch" in nosuch.json()["detail"]


def test_task_paths_must_stay_in_the_task_directory(server: LiveServer) -> None:
    vision = team(server, "vision")
    for bad in ({"outputs": ["../x"]}, {"outputs": ["/etc/passwd"]}, {"checkpoint_dir": "a/../../b"}):
        r = vision.post("/api/v1/tasks", json={"queue": "gpu", "command": ["true"], **bad})
        assert r.status_code == 422 and "inside the task's directory" in r.json()["detail"], r.text
    r = vision.post("/api/v1/tasks", json={"queue": "gpu", "command": ["true"], "code": {"snapshot": "x"}})
    assert r.status_code == 422
    r = vision.post("/api/v1/tasks", json={"queue": "gpu", "command": ["true"], "checkpoint_every_s": 60})
    assert r.status_code == 422 and "needs a checkpoint_dir" in r.json()["detail"]


def test_an_image_task_may_carry_files_and_a_working_dir_task_may_not(server: LiveServer) -> None:
    vision = team(server, "vision")
    digest = upload(vision, tgz({"main.sh": b"echo hi"}))["digest"]
    carried = {"code": {"snapshot": digest}, "setup": "true", "outputs": ["out"], "checkpoint_dir": "ckpt"}
    base = {"queue": "gpu", "command": ["sh", "main.sh"], "image": "registry.example/busybox:1"}
    r = vision.post("/api/v1/tasks", json={**base, **carried})
    assert r.status_code == 201, r.text
    got = vision.get(f"/api/v1/tasks/{r.json()['id']}").json()
    assert got["image"] == base["image"] and got["setup"] == "true" and got["checkpoint_dir"] == "ckpt"
    for field in carried:
        r = vision.post(
            "/api/v1/tasks",
            json={"queue": "gpu", "command": ["true"], "working_dir": "/srv/x", field: carried[field]},
        )
        assert r.status_code == 422 and "drop working_dir" in r.json()["detail"], (field, r.text)


def test_no_store_configured_says_so(ctx: AppContext) -> None:
    s = LiveServer(ctx).start()
    try:
        r = team(s, "vision").post("/api/v1/snapshots", content=b"abc")
        assert r.status_code == 409 and "no artifact store" in r.json()["detail"]
    finally:
        s.stop()


def test_worker_transfers_are_task_scoped_and_die_with_the_attempt(server: LiveServer) -> None:
    vision, nlp = team(server, "vision"), team(server, "nlp")
    code = tgz({"main.py": b"print(1)\n"})
    digest = upload(vision, code)["digest"]
    task = {
        "queue": "gpu",
        "command": ["python", "main.py"],
        "gpus": 0,
        "code": {"snapshot": digest},
        "outputs": ["out/result.txt"],
        "checkpoint_dir": "ckpt",
    }
    task_id = vision.post("/api/v1/tasks", json=task).json()["id"]
    worker_id, w = worker(server)
    leased = w.post(f"/api/v1/workers/{worker_id}/lease", json={}).json()["task"]
    tr = leased["transfers"]
    assert tr["code_digest"] == digest and tr["checkpoint_url"] is None  # first attempt: nothing to restore
    got = httpx.get(server.url + tr["code_url"])
    assert got.status_code == 200 and got.content == code
    # No credentials travel: the URL is the authorization, and only for what it names.
    forged = tr["code_url"][:-3] + ("AAA" if not tr["code_url"].endswith("AAA") else "BBB")
    assert httpx.get(server.url + forged).status_code == 403
    assert httpx.put(server.url + tr["code_url"], content=b"x").status_code == 403  # a get ticket does not put

    w.post(f"/api/v1/workers/{worker_id}/tasks/{task_id}/start", json={})
    r = httpx.put(server.url + tr["output_urls"]["out/result.txt"], content=b"42\n")
    assert r.status_code == 200, r.text
    assert r.json()["digest"] == "sha256:" + hashlib.sha256(b"42\n").hexdigest()
    checkpoint = tgz({"step": b"7"})
    r = httpx.put(server.url + tr["checkpoint_upload_url"], content=checkpoint)
    assert r.status_code == 200 and r.json()["kind"] == "checkpoint"

    listed = vision.get(f"/api/v1/tasks/{task_id}/artifacts").json()
    assert {(a["name"], a["kind"], a["size"], a["attempt"]) for a in listed} == {
        ("out/result.txt", "output", 3, 1),
        ("checkpoint.tar.gz", "checkpoint", len(checkpoint), 1),
    }
    dl = vision.get(f"/api/v1/tasks/{task_id}/artifacts/out/result.txt")
    assert dl.status_code == 200 and dl.content == b"42\n"
    assert nlp.get(f"/api/v1/tasks/{task_id}/artifacts").status_code == 404
    assert nlp.get(f"/api/v1/tasks/{task_id}/artifacts/out/result.txt").status_code == 404
    missing = vision.get(f"/api/v1/tasks/{task_id}/artifacts/nope")
    assert missing.status_code == 404 and "autoscaler artifacts" in missing.json()["detail"]

    # The attempt ends (a spot reclaim): its upload tickets stop working...
    w.post(f"/api/v1/workers/{worker_id}/tasks/{task_id}/finish", json={"reason": "interrupted"})
    late = httpx.put(server.url + tr["output_urls"]["out/result.txt"], content=b"tampered")
    assert late.status_code == 403 and "is over" in late.json()["detail"]
    assert vision.get(f"/api/v1/tasks/{task_id}/artifacts/out/result.txt").content == b"42\n"
    # ...and the next attempt is handed the checkpoint to restore.
    again = w.post(f"/api/v1/workers/{worker_id}/lease", json={}).json()["task"]
    assert again["attempts"] == 2
    ck = httpx.get(server.url + again["transfers"]["checkpoint_url"])
    assert ck.content == checkpoint
    assert again["transfers"]["checkpoint_digest"] == "sha256:" + hashlib.sha256(checkpoint).hexdigest()
