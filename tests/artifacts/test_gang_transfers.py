"""A gang's files through the real server (uvicorn on 127.0.0.1, real database, local
store): every rank fetches the same code on tickets of its own, stores its outputs and
checkpoints under its rank, and a requeued gang restores one generation all ranks
completed, rank R getting rank R's file. Tickets of one gang's rank are refused to a
worker of another gang, to a single task's worker, to another rank and to a later attempt."""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from autoscaler.api.context import AppContext
from autoscaler.api.routes.artifacts import TRANSFER, ticket_key
from autoscaler.artifacts import tickets
from autoscaler.artifacts.store import LocalStore
from tests.artifacts.test_api import HTTP_TIMEOUT_S, client, team, tgz, upload
from tests.conftest import LiveServer, issue_token
from tests.test_cli import cli
from tests.waiting import wait_for


@pytest.fixture
def server(ctx: AppContext, tmp_path: Path) -> Iterator[LiveServer]:
    ctx.artifacts = LocalStore(tmp_path / "store")
    s = LiveServer(ctx).start()
    yield s
    s.stop()


def register(server: LiveServer, n: int) -> tuple[str, httpx.Client]:
    join = issue_token(server.ctx, "join", pool="gpu-pool", ttl=timedelta(hours=1))
    body = {
        "hostname": f"h{n}",
        "instance_id": f"i-g{n}",
        "provider": "fake",
        "pool": "gpu-pool",
        "gpus": [{"index": 0, "model": "NVIDIA A10G", "uuid": f"GPU-{n}", "memory_mb": 24000}],
    }
    r = httpx.post(
        f"{server.url}/api/v1/workers/register",
        json=body,
        headers={"Authorization": f"Bearer {join}"},
        timeout=HTTP_TIMEOUT_S,
    )
    assert r.status_code == 201, r.text
    return r.json()["worker_id"], client(server, r.json()["worker_token"])


def lease(w: tuple[str, httpx.Client]) -> dict[str, Any] | None:
    worker_id, c = w
    reply = c.post(f"/api/v1/workers/{worker_id}/lease", json={})
    assert reply.status_code == 200, reply.text
    task: dict[str, Any] | None = reply.json()["task"]
    return task


def lease_gang(w0: tuple[str, httpx.Client], w1: tuple[str, httpx.Client]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both ranks of the one gang waiting: w0 reserves first, w1 completes it."""
    assert lease(w0) is None
    got1 = lease(w1)
    got0 = lease(w0)
    assert got0 is not None and got1 is not None
    return got0, got1


def put(server: LiveServer, url: str, body: bytes, **params: Any) -> httpx.Response:
    return httpx.put(server.url + url, content=body, params=params, timeout=HTTP_TIMEOUT_S)


def step_of(archive: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        member = tar.extractfile("step")
        assert member is not None
        return member.read().decode()


GANG = {"queue": "gpu", "command": ["python", "main.py"], "gpus": 1, "nodes": 2}


def test_every_rank_fetches_the_code_and_stores_its_outputs_under_its_rank(server: LiveServer, tmp_path: Path) -> None:
    token = issue_token(server.ctx, "team", team="vision")
    vision = client(server, token)
    code = tgz({"main.py": b"print(1)\n"})
    digest = upload(vision, code)["digest"]
    r = vision.post("/api/v1/tasks", json={**GANG, "code": {"snapshot": digest}, "outputs": ["out/result.txt"]})
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    w0, w1 = register(server, 0), register(server, 1)
    got0, got1 = lease_gang(w0, w1)
    tr0, tr1 = got0["transfers"], got1["transfers"]
    # The same code for every rank, on tickets of each rank's own.
    assert tr0["code_digest"] == tr1["code_digest"] == digest and tr0["code_url"] != tr1["code_url"]
    assert httpx.get(server.url + tr0["code_url"]).content == code
    assert httpx.get(server.url + tr1["code_url"]).content == code
    for w, tr, body in ((w0, tr0, b"zero\n"), (w1, tr1, b"one\n")):
        w[1].post(f"/api/v1/workers/{w[0]}/tasks/{task_id}/start", json={})
        stored = put(server, tr["output_urls"]["out/result.txt"], body)
        assert stored.status_code == 200, stored.text
        assert stored.json()["digest"] == "sha256:" + hashlib.sha256(body).hexdigest()
    listed = vision.get(f"/api/v1/tasks/{task_id}/artifacts").json()
    assert sorted((a["name"], a["rank"], a["attempt"]) for a in listed) == [
        ("rank-0/out/result.txt", 0, 1),
        ("rank-1/out/result.txt", 1, 1),
    ]
    assert vision.get(f"/api/v1/tasks/{task_id}/artifacts/rank-1/out/result.txt").content == b"one\n"
    assert vision.get(f"/api/v1/tasks/{task_id}/artifacts/out/result.txt").status_code == 404  # no top level
    # The CLI lists them with their rank and downloads each under its rank-R/.
    where = ["--server", server.url, "--token", token]
    listed_cli = cli("artifacts", task_id, *where)
    assert listed_cli.returncode == 0, listed_cli.stderr
    assert "rank" in listed_cli.stdout and "rank-1/out/result.txt" in listed_cli.stdout
    saved = cli("artifacts", task_id, "--download", str(tmp_path / "dl"), *where)
    assert saved.returncode == 0, saved.stderr
    assert (tmp_path / "dl" / "rank-0" / "out" / "result.txt").read_bytes() == b"zero\n"
    assert (tmp_path / "dl" / "rank-1" / "out" / "result.txt").read_bytes() == b"one\n"


def test_a_gang_ticket_works_only_for_its_rank_of_its_attempt(server: LiveServer) -> None:
    """Signed by the server itself, so only the database check can refuse them."""
    vision = team(server, "vision")
    a = vision.post("/api/v1/tasks", json={**GANG, "outputs": ["o"]}).json()["id"]
    wa0, wa1 = register(server, 0), register(server, 1)
    lease_gang(wa0, wa1)
    b = vision.post("/api/v1/tasks", json={**GANG, "outputs": ["o"]}).json()["id"]
    wb0, wb1 = register(server, 2), register(server, 3)
    lease_gang(wb0, wb1)
    assert {r["worker_id"] for r in vision.get(f"/api/v1/tasks/{b}").json()["ranks"]} == {wb0[0], wb1[0]}
    single = vision.post("/api/v1/tasks", json={"queue": "gpu", "command": ["x"], "gpus": 1, "outputs": ["o"]})
    ws = register(server, 4)
    assert (lease(ws) or {}).get("id") == single.json()["id"]
    key = ticket_key(server.ctx)
    far = server.ctx.clock.now().timestamp() + 3600

    def signed(op: str, worker: str, rank: int | None, attempt: int = 1, task: str = a) -> str:
        t = tickets.Ticket(op, "k", task, attempt, worker, far, kind="output", name="o", rank=rank)  # type: ignore[arg-type]
        return TRANSFER + tickets.sign(t, key)

    rank_of_a0 = next(r["rank"] for r in vision.get(f"/api/v1/tasks/{a}").json()["ranks"] if r["worker_id"] == wa0[0])
    assert put(server, signed("put", wa0[0], rank_of_a0), b"ok").status_code == 200  # the genuine one
    refused = [
        signed("put", wb0[0], 0),  # a worker of gang B
        signed("put", wb0[0], 1),
        signed("put", ws[0], None),  # a single task's worker, as a single task's ticket
        signed("put", ws[0], 0),
        signed("put", wa0[0], 1 - rank_of_a0),  # gang A's worker, another rank
        signed("put", wa0[0], rank_of_a0, attempt=2),  # an attempt that is not its
        signed("put", wa0[0], None),  # gang A's worker without its rank
    ]
    for url in refused:
        r = put(server, url, b"x")
        assert r.status_code == 403 and "is over" in r.json()["detail"], (url, r.text)
    assert httpx.get(server.url + signed("get", wb0[0], 0)).status_code == 403
    # The gang is requeued: attempt 1's tickets die, also on the same workers.
    old = signed("put", wa0[0], rank_of_a0)
    wa1[1].post(f"/api/v1/workers/{wa1[0]}/tasks/{a}/finish", json={"reason": "interrupted"})
    wa0[1].post(f"/api/v1/workers/{wa0[0]}/tasks/{a}/finish", json={"reason": "interrupted"})
    assert lease(wa0) is None
    assert lease(wa1) is not None
    assert put(server, old, b"replay").status_code == 403
    names = {x["name"]: x["size"] for x in vision.get(f"/api/v1/tasks/{a}/artifacts").json()}
    assert names == {f"rank-{rank_of_a0}/o": 2}


def test_a_requeued_gang_restores_one_generation_all_ranks_completed(server: LiveServer) -> None:
    vision = team(server, "vision")
    r = vision.post("/api/v1/tasks", json={**GANG, "checkpoint_dir": "ckpt", "checkpoint_every_s": 60})
    task_id = r.json()["id"]
    w0, w1 = register(server, 0), register(server, 1)
    got0, got1 = lease_gang(w0, w1)
    by_rank = {0: (w0, got0), 1: (w1, got1)}
    by_rank = {int(got["env"]["NODE_RANK"]): (w, got) for w, got in by_rank.values()}
    assert all(got["transfers"]["checkpoint_url"] is None for _w, got in by_rank.values())  # nothing yet

    def ckpt(rank: int, gen: int, attempt: int) -> bytes:
        return tgz({"step": f"rank {rank} gen {gen} attempt {attempt}".encode()})

    def store(rank: int, gen: int, attempt: int = 1) -> httpx.Response:
        url = by_rank[rank][1]["transfers"]["checkpoint_upload_url"]
        return put(server, url, ckpt(rank, gen, attempt), generation=gen, format="tar.gz")

    # Generation 1 from both ranks; generation 2 only from rank 0 (rank 1's upload failed).
    for rank, gen in ((0, 1), (1, 1), (0, 2)):
        assert store(rank, gen).status_code == 200
    assert store(0, 2).status_code == 409  # write-once: a stored generation never changes
    # Rank 1 is lost; rank 0 is stopped and stores a last generation while it stops.
    (w_1, _), (w_0, _) = by_rank[1], by_rank[0]
    w_1[1].post(f"/api/v1/workers/{w_1[0]}/tasks/{task_id}/finish", json={"reason": "interrupted"})
    assert vision.get(f"/api/v1/tasks/{task_id}").json()["state"] == "queued"
    assert store(0, 3).status_code == 200  # a stopping rank still stores its files
    w_0[1].post(f"/api/v1/workers/{w_0[0]}/tasks/{task_id}/finish", json={"reason": "interrupted"})
    assert store(0, 4).status_code == 403  # ...until it reported its end

    again0, again1 = lease_gang(w0, w1)
    restored = {}
    for got in (again0, again1):
        tr = got["transfers"]
        body = httpx.get(server.url + tr["checkpoint_url"]).content
        assert tr["checkpoint_digest"] == "sha256:" + hashlib.sha256(body).hexdigest()
        restored[int(got["env"]["NODE_RANK"])] = body
    # Generation 1, each rank its own: never rank 0's newer 2 or 3 beside rank 1's 1.
    assert {rank: step_of(body) for rank, body in restored.items()} == {
        0: "rank 0 gen 1 attempt 1",
        1: "rank 1 gen 1 attempt 1",
    }

    # Attempt 2 completes a generation: the older ones go, but for the set it restored
    # (a rank of it may still be downloading).
    by_rank = {int(got["env"]["NODE_RANK"]): (w, got) for w, got in ((w0, again0), (w1, again1))}
    assert store(0, 1, attempt=2).status_code == 200
    assert store(1, 1, attempt=2).status_code == 200
    listed = vision.get(f"/api/v1/tasks/{task_id}/artifacts").json()
    assert sorted((a["attempt"], a["generation"], a["rank"]) for a in listed) == [
        (1, 1, 0),
        (1, 1, 1),
        (2, 1, 0),
        (2, 1, 1),
    ]
    assert {a["name"] for a in listed} == {"rank-0/checkpoint.tar.gz", "rank-1/checkpoint.tar.gz"}
    store_dir = Path(str(server.ctx.artifacts.root))  # type: ignore[union-attr]
    assert len([p for p in store_dir.rglob("*") if p.is_file() and "/checkpoint/" in str(p)]) == 4
    # Attempt 2 ends: the set it restored from goes with it (and its files).
    for w, _got in by_rank.values():
        w[1].post(f"/api/v1/workers/{w[0]}/tasks/{task_id}/finish", json={"reason": "exit", "exit_code": 0})
    listed = vision.get(f"/api/v1/tasks/{task_id}/artifacts").json()
    assert sorted((a["attempt"], a["generation"], a["rank"]) for a in listed) == [(2, 1, 0), (2, 1, 1)]
    assert len([p for p in store_dir.rglob("*") if p.is_file() and "/checkpoint/" in str(p)]) == 2


def test_the_set_an_attempt_restores_is_fixed_when_its_gang_is_complete(server: LiveServer) -> None:
    """A rank of attempt 1, still being stopped, completes a newer generation between
    the two ranks of attempt 2 being handed their starts: both still restore the same."""
    vision = team(server, "vision")
    task_id = vision.post("/api/v1/tasks", json={**GANG, "checkpoint_dir": "ckpt"}).json()["id"]
    w0, w1, w2, w3 = (register(server, n) for n in range(4))
    first = {int(got["env"]["NODE_RANK"]): (w, got) for w, got in zip((w0, w1), lease_gang(w0, w1), strict=True)}

    def store(rank: int, gen: int) -> None:
        url = first[rank][1]["transfers"]["checkpoint_upload_url"]
        assert put(server, url, tgz({"step": f"{rank}/{gen}".encode()}), generation=gen).status_code == 200

    store(0, 1), store(1, 1), store(1, 2)
    lost = first[1][0]
    lost[1].post(f"/api/v1/workers/{lost[0]}/tasks/{task_id}/finish", json={"reason": "interrupted"})
    assert lease(w2) is None  # attempt 2's rank 0 reserved
    late = lease(w3)  # the gang is complete: rank 1's start (and the set to restore) now
    assert late is not None
    store(0, 2)  # attempt 1's rank 0, being stopped, completes generation 2
    early = lease(w2)
    assert early is not None
    got = {
        int(t["env"]["NODE_RANK"]): step_of(httpx.get(server.url + t["transfers"]["checkpoint_url"]).content)
        for t in (early, late)
    }
    assert got == {0: "0/1", 1: "1/1"}


class HeldUpload:
    """A PUT whose body stops after its first block until `finish()`: the server has
    passed its early write-once check and is streaming into the store (its `.part` file
    is there) when another upload of the same artifact runs to its end."""

    def __init__(self, server: LiveServer, url: str, body: bytes, **params: Any) -> None:
        self._go = threading.Event()
        self._reply: list[httpx.Response] = []

        def blocks() -> Iterator[bytes]:
            yield body[:1]
            self._go.wait(30)
            yield body[1:]

        def send() -> None:
            self._reply.append(httpx.put(server.url + url, content=blocks(), params=params, timeout=30))

        self._thread = threading.Thread(target=send, daemon=True)
        store_dir = Path(str(server.ctx.artifacts.root))  # type: ignore[union-attr]
        self._thread.start()
        wait_for(
            "the held upload to stream into the store",
            lambda: any(p.name.endswith(".part") for p in store_dir.rglob("*")),
        )

    def finish(self) -> httpx.Response:
        self._go.set()
        self._thread.join(30)
        return self._reply[0]


def test_two_uploads_of_one_generation_in_flight_at_once_store_the_first_to_finish(server: LiveServer) -> None:
    """Both pass the early check; the one recorded second is refused (409, never a 500
    from the unique index) and its bytes never replace the stored generation's."""
    vision = team(server, "vision")
    task_id = vision.post("/api/v1/tasks", json={**GANG, "checkpoint_dir": "ckpt"}).json()["id"]
    got = {int(g["env"]["NODE_RANK"]): g for g in lease_gang(register(server, 0), register(server, 1))}
    url = got[0]["transfers"]["checkpoint_upload_url"]
    slow, fast = tgz({"step": b"slow"}), tgz({"step": b"fast"})
    held = HeldUpload(server, url, slow, generation=1, format="tar.gz")
    assert put(server, url, fast, generation=1, format="tar.gz").status_code == 200
    late = held.finish()
    assert late.status_code == 409 and "already stored" in late.json()["detail"], late.text
    listed = vision.get(f"/api/v1/tasks/{task_id}/artifacts").json()
    assert [(a["name"], a["generation"]) for a in listed] == [("rank-0/checkpoint.tar.gz", 1)]
    body = vision.get(f"/api/v1/tasks/{task_id}/artifacts/rank-0/checkpoint.tar.gz", params={"generation": 1})
    assert step_of(body.content) == "fast" and listed[0]["digest"] == "sha256:" + hashlib.sha256(fast).hexdigest()
    store_dir = Path(str(server.ctx.artifacts.root))  # type: ignore[union-attr]
    assert (
        len([p for p in store_dir.rglob("*") if p.is_file() and "/checkpoint/" in str(p)]) == 1
    )  # the refused one's bytes are gone


def test_a_retried_output_upload_racing_its_first_try_leaves_one_consistent_version(server: LiveServer) -> None:
    """A single task's output is replaced by its newest upload: whichever is recorded last
    names the artifact, with its own bytes and digest, and the replaced bytes are deleted."""
    vision = team(server, "vision")
    task_id = vision.post("/api/v1/tasks", json={**GANG, "nodes": 1, "outputs": ["o"]}).json()["id"]
    w = register(server, 0)
    got = lease(w)
    assert got is not None and got["id"] == task_id
    w[1].post(f"/api/v1/workers/{w[0]}/tasks/{task_id}/start", json={})
    url = got["transfers"]["output_urls"]["o"]
    held = HeldUpload(server, url, b"first try")
    assert put(server, url, b"retry").status_code == 200
    late = held.finish()
    assert late.status_code == 200, late.text
    listed = vision.get(f"/api/v1/tasks/{task_id}/artifacts").json()
    assert [(a["name"], a["digest"]) for a in listed] == [("o", "sha256:" + hashlib.sha256(b"first try").hexdigest())]
    assert vision.get(f"/api/v1/tasks/{task_id}/artifacts/o").content == b"first try"
    store_dir = Path(str(server.ctx.artifacts.root))  # type: ignore[union-attr]
    assert len([p for p in store_dir.rglob("*") if p.is_file() and "/output/" in str(p)]) == 1


def test_an_agent_whose_checkpoint_answer_was_lost_retries_into_the_stored_generation(
    server: LiveServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try is stored but its answer never arrives (a timeout): the retry is
    refused as already stored, which is this upload's own success, not a failure."""
    from autoscaler.agent import carry
    from autoscaler.agent.wire import LeasedTask

    vision = team(server, "vision")
    r = vision.post("/api/v1/tasks", json={**GANG, "checkpoint_dir": "ckpt", "checkpoint_every_s": 60})
    task_id = r.json()["id"]
    got0, _got1 = lease_gang(register(server, 0), register(server, 1))
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step").write_text("7")
    real_put, calls = httpx.put, []

    def answer_lost_once(*args: Any, **kw: Any) -> httpx.Response:
        calls.append(args[0])
        reply = real_put(*args, **kw)
        if len(calls) == 1:
            raise httpx.ReadTimeout("the answer was lost")
        return reply

    monkeypatch.setattr(carry.httpx, "put", answer_lost_once)
    notes: list[str] = []
    carry.save_checkpoint(server.url, LeasedTask.model_validate(got0), tmp_path, notes.append, generation=1)
    assert len(calls) == 2 and notes and notes[0].startswith("checkpoint: saved ckpt"), notes
    rank = int(got0["env"]["NODE_RANK"])
    stored = [a for a in vision.get(f"/api/v1/tasks/{task_id}/artifacts").json() if a["kind"] == "checkpoint"]
    assert [(a["name"], a["generation"]) for a in stored] == [(f"rank-{rank}/checkpoint.tar.gz", 1)]
    # A first try refused so is someone else's generation: still a failure.
    monkeypatch.setattr(carry.httpx, "put", real_put)
    with pytest.raises(carry.CarryFailed, match="409"):
        carry.save_checkpoint(server.url, LeasedTask.model_validate(got0), tmp_path, notes.append, generation=1)
