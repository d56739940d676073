"""Snapshots and artifacts: teams upload code snapshots and list and download what
their tasks left; workers fetch and store one attempt's files on transfer tickets.

Bodies stream: an upload is read block by block into the store (no whole file in
memory, no database transaction held while it flows), a download is streamed out.
A team sees only its own snapshots and artifacts; another team's task answers 404.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Annotated

import anyio.from_thread
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy.orm import Session
from starlette.requests import ClientDisconnect

from autoscaler.api.context import AppContext
from autoscaler.api.deps import Auth, Ctx, tx
from autoscaler.api.routes.tasks import visible_task
from autoscaler.api.schemas import ArtifactOut, SnapshotOut, TransfersOut
from autoscaler.artifacts import gang_checkpoints, records, tickets
from autoscaler.artifacts.store import ArtifactStore, StoreError
from autoscaler.errors import Conflict, Forbidden, InvalidInput, NotFound
from autoscaler.queueing import gangs
from autoscaler.queueing.states import ACTIVE
from autoscaler.state.models import Task

router = APIRouter(tags=["artifacts"])
SNAPSHOTS = "/api/v1/snapshots"
TRANSFER = "/api/v1/transfer/"
_ACTIVE = {s.value for s in ACTIVE}


def streams_body(method: str, path: str) -> bool:
    """Requests whose body the route streams itself (the body guard lets them through)."""
    return (method == "POST" and path == SNAPSHOTS) or (method == "PUT" and path.startswith(TRANSFER))


def store_of(ctx: AppContext) -> ArtifactStore:
    if ctx.artifacts is None:
        raise Conflict("this server has no artifact store: see `artifacts` in the config (docs/artifacts.md)")
    return ctx.artifacts


def ticket_key(ctx: AppContext) -> bytes:
    if ctx.secret_keys is None:
        raise Conflict("this server has no secret key, so it cannot sign transfer tickets: see server.secret_key_file")
    return tickets.transfer_key(ctx.secret_keys.keys[0])


def request_blocks(request: Request) -> Iterator[bytes]:
    """The request body block by block, for a sync route running in a worker thread."""
    stream = request.stream().__aiter__()

    async def next_block() -> bytes:
        return await stream.__anext__()

    while True:
        try:
            block = anyio.from_thread.run(next_block)
        except StopAsyncIteration:
            return
        except ClientDisconnect:
            raise InvalidInput("the upload was cut off before its end; send it again") from None
        if block:
            yield block


@router.post(SNAPSHOTS, response_model=SnapshotOut, status_code=201)
def upload_snapshot(
    request: Request,
    auth: Auth,
    ctx: Ctx,
    team: Annotated[str | None, Query(max_length=64, description="Admins only: the team the snapshot is for.")] = None,
) -> SnapshotOut:
    """A code snapshot: the raw tar.gz as the body. Answers its digest, which a task names
    in `code.snapshot`; the client compares it with its own to check the upload. A
    snapshot belongs to one team; an admin uploads for the team it enqueues for."""
    store = store_of(ctx)
    with tx(ctx) as s:
        principal = auth.user(s)
    if principal.is_admin:
        team = team or "default"
        ctx.config.check_team(team)
    elif team and team != principal.team:
        raise Forbidden(f"a {principal.team} token cannot upload a snapshot for team {team}")
    else:
        team = principal.team or "default"
    # Stored under a temporary key first: the final key is the digest, known at the end.
    staging = f"staging/{team}/{time.time_ns()}"
    try:
        written = store.put(staging, request_blocks(request), limit_bytes=ctx.config.artifacts.max_snapshot_bytes)
    except StoreError:
        store.delete(staging)
        raise
    if written.size == 0:
        store.delete(staging)
        raise InvalidInput("the snapshot is empty: send the tar.gz as the request body")
    key = records.snapshot_key(team, written.digest)
    try:
        if store.exists(key):
            store.delete(staging)
        else:
            store.put(key, store.get(staging))
            store.delete(staging)
    except StoreError:
        store.delete(staging)
        raise
    with tx(ctx) as s:
        records.record_snapshot(s, team, key, written, ctx.clock.now())
    return SnapshotOut(digest=written.digest, size=written.size)


@router.get("/api/v1/tasks/{task_id}/artifacts", response_model=list[ArtifactOut])
def list_artifacts(task_id: str, auth: Auth, ctx: Ctx) -> list[ArtifactOut]:
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id)
        return [ArtifactOut.model_validate(a) for a in records.list_artifacts(s, task.id)]


@router.get("/api/v1/tasks/{task_id}/artifacts/{name:path}")
def download_artifact(
    task_id: str,
    name: str,
    auth: Auth,
    ctx: Ctx,
    attempt: Annotated[int | None, Query(ge=1, le=2**31)] = None,
    generation: Annotated[
        int | None, Query(ge=0, le=2**31, description="A gang's checkpoint: this generation (default the latest).")
    ] = None,
) -> StreamingResponse:
    """The artifact's bytes (of the latest attempt that left one, or of `attempt`; its
    latest generation, or `generation`)."""
    store = store_of(ctx)
    with tx(ctx) as s:
        task = visible_task(s, auth.user(s), task_id)
        art = records.find_artifact(s, task.id, name, attempt, generation)
        if art is None:
            which = f" from attempt {attempt}" if attempt else ""
            which += f" of generation {generation}" if generation is not None else ""
            raise NotFound(f"task {task_id} has no artifact {name!r}{which}: list them with `autoscaler artifacts`")
        key, digest, size = art.key, art.digest, art.size
    blocks = store.get(key)
    return StreamingResponse(
        blocks,
        media_type="application/octet-stream",
        headers={"X-Digest": digest, "Content-Length": str(size)},
    )


@router.get(TRANSFER + "{ticket}")
def transfer_get(ticket: str, ctx: Ctx) -> StreamingResponse:
    """A worker fetches one object (code snapshot, checkpoint) on the ticket of its lease."""
    store = store_of(ctx)
    t = tickets.verify(ticket, ticket_key(ctx), now=ctx.clock.now().timestamp(), op="get")
    if t.rank is not None:
        with tx(ctx) as s:
            _live_attempt(s, t)  # a gang's rank: only while it holds that rank of that attempt
    return StreamingResponse(store.get(t.key), media_type="application/octet-stream")


@router.put(TRANSFER + "{ticket}", response_model=ArtifactOut)
def transfer_put(
    ticket: str,
    request: Request,
    ctx: Ctx,
    format: Annotated[str, Query(pattern="^(file|tar.gz)$")] = "file",
    generation: Annotated[
        int,
        Query(
            ge=0,
            le=2**31 - 1,
            description="A gang's checkpoint: the k-th checkpoint point of the attempt (the agent numbers them).",
        ),
    ] = 0,
) -> ArtifactOut:
    """A worker stores one output or checkpoint of its live attempt; answers what was
    recorded (the worker compares the digest with its own)."""
    store = store_of(ctx)
    t = tickets.verify(ticket, ticket_key(ctx), now=ctx.clock.now().timestamp(), op="put")
    # A gang's rank stores under its own rank-R/, whatever the name (docs/gangs.md).
    name = records.rank_name(t.rank, t.name + (".tar.gz" if format == "tar.gz" and t.kind == "output" else ""))
    # Generations are a gang's checkpoints' (a single task's periodic one replaces its last).
    gen = generation if t.rank is not None and t.kind == "checkpoint" else 0
    stored = Conflict(f"generation {gen} of {name} of attempt {t.attempt} is already stored; it is kept as is")
    with tx(ctx) as s:
        task = _live_attempt(s, t)
        team = task.team
        if gen and records.find_version(s, t.task_id, name, t.attempt, gen) is not None:
            raise stored  # write-once: a set another rank may be restoring from never changes under it
    # The upload's own key: a concurrent or retried upload of the same artifact never
    # overwrites these bytes; the row recorded below is what names the artifact.
    key = records.artifact_key(t.task_id, t.attempt, t.kind, name, gen, upload=records.upload_id())
    written = store.put(key, request_blocks(request), limit_bytes=ctx.config.artifacts.max_artifact_bytes)
    try:
        with tx(ctx) as s:
            art, replaced = records.record_artifact(
                s,
                task_id=t.task_id,
                team=team,
                attempt=t.attempt,
                kind=t.kind,
                name=name,
                key=key,
                written=written,
                now=ctx.clock.now(),
                rank=t.rank,
                generation=gen,
            )
            out = ArtifactOut.model_validate(art)
            gang = s.get(Task, t.task_id) if t.rank is not None and t.kind == "checkpoint" else None
            gone = gang_checkpoints.prune(s, gang) if gang is not None else []
    except records.AlreadyStored:
        store.delete(key)
        raise stored from None
    except BaseException:
        store.delete(key)  # not recorded: nothing names these bytes
        raise
    records.delete_objects(store, gone)
    if replaced is not None:
        store.delete(replaced)  # the version this upload replaced, once no row names it
    return out


def _live_attempt(session: Session, t: tickets.Ticket) -> Task:
    """The ticket's task while the ticket's attempt is live on the ticket's worker; a
    gang's ticket: while that worker holds that rank of that attempt (also while it is
    being stopped, so its last checkpoint and outputs are stored)."""
    task = session.get(Task, t.task_id)
    over = Forbidden(f"attempt {t.attempt} of task {t.task_id} is over on this worker: its uploads are closed")
    if task is None:
        raise over
    if t.rank is None:
        if task.worker_id != t.worker_id or task.attempts != t.attempt or task.state not in _ACTIVE:
            raise over
        return task
    rank = gangs.rank_of(session, task.id, t.worker_id)
    if rank is None or rank.attempt != t.attempt or rank.rank != t.rank:
        raise over
    return task


def transfers_for(session: Session, ctx: AppContext, worker_id: str, task: Task) -> TransfersOut | None:
    """The URLs the leasing worker needs for this attempt, or None when the task carries
    no files. Download tickets live `artifacts.ticket_ttl_s`; upload tickets as long as
    the attempt can (its timeout, else a week) and die with it anyway (`_live_attempt`)."""
    code = task.code or {}
    if not (code or task.outputs or task.checkpoint_dir):
        return None
    store = store_of(ctx)
    key = ticket_key(ctx)
    now = ctx.clock.now().timestamp()
    cfg = ctx.config.artifacts
    put_ttl = (task.timeout_s or 7 * 86400) + 3600
    # A gang: every ticket names this worker's rank, and what the rank stores is its own.
    held = gangs.rank_of(session, task.id, worker_id) if gangs.is_gang(task) else None
    if gangs.is_gang(task) and held is None:
        raise Conflict(f"worker {worker_id} holds no rank of task {task.id}: it has no files to move")
    rank = held.rank if held is not None else None
    attempt = held.attempt if held is not None else task.attempts

    def get_url(store_key: str) -> str:
        # A gang's rank gets the server's own ticket even where the store could sign a
        # URL: only a ticket dies with the rank (a presigned URL lives its whole TTL).
        signed = store.presigned_get(store_key, cfg.ticket_ttl_s) if rank is None else None
        if signed is not None:
            return signed
        t = tickets.Ticket("get", store_key, task.id, attempt, worker_id, now + cfg.ticket_ttl_s, rank=rank)
        return TRANSFER + tickets.sign(t, key)

    def put_url(kind: str, name: str) -> str:
        t = tickets.Ticket("put", "", task.id, attempt, worker_id, now + put_ttl, kind=kind, name=name, rank=rank)
        return TRANSFER + tickets.sign(t, key)

    out = TransfersOut()
    digest = code.get("snapshot") or code.get("diff_snapshot")
    if digest:
        snap = records.find_snapshot(session, task.team, str(digest))
        if snap is None:
            raise NotFound(f"code snapshot {digest} of task {task.id} is no longer stored (retention?)")
        out.code_url, out.code_digest = get_url(snap.key), snap.digest
    if task.checkpoint_dir:
        if held is not None:
            # Rank R restores rank R's file of one generation all ranks completed.
            pin = gang_checkpoints.pinned_at(session, task)
            last = gang_checkpoints.restore_set(session, task, as_of=pin).get(held.rank) if pin else None
        else:
            last = records.latest_checkpoint(session, task.id)
        if last is not None:
            out.checkpoint_url, out.checkpoint_digest = get_url(last.key), last.digest
        out.checkpoint_upload_url = put_url("checkpoint", records.CHECKPOINT_NAME)
    out.output_urls = {p: put_url("output", p) for p in task.outputs or []}
    return out
