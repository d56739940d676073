"""A multi-node task that carries its code, outputs and checkpoints, end to end on one
machine: `autoscaler up` (a real process: API, reconciler, embedded policy, local
provider, real agent processes, the local artifact store). A 2-node gang's ranks run a
script from its `code` snapshot that counts steps into its checkpoint dir; once both
ranks stored a periodic checkpoint, rank 1's agent is killed. The gang is requeued as
one, and on the next attempt each rank resumes from its OWN counter of one generation
both ranks completed (never rank 0's newer stop-time checkpoint beside rank 1's older
one), then succeeds; its outputs are listed per rank."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.local_up import kill_rank_agent, local_up, until_requeued
from tests.local_up import until as _until

# Rank R counts steps into ckpt/step as "R STEP" (written, then renamed), rank 0 faster
# than rank 1 so the two counters differ; it resumes from the file if one was restored
# (and refuses another rank's). SIGTERM: a last write, then exit. Once GANG_GO exists
# and it made 3 steps past where it started, it writes its output and exits 0.
RANK = r"""
import os, signal, sys, time
rank = int(os.environ["NODE_RANK"])
start = 0
if os.path.exists("ckpt/step"):
    owner, step = open("ckpt/step").read().split()
    if int(owner) != rank:
        print("WRONG RANK", owner, flush=True)
        sys.exit(3)
    start = int(step)
print("RESUMED", rank, start, os.environ["AUTOSCALER_TASK_ATTEMPT"], flush=True)
step = start

def save():
    with open("ckpt/.step", "w") as f:
        f.write(f"{rank} {step}")
    os.replace("ckpt/.step", "ckpt/step")

def stop(*_):
    save()
    sys.exit(143)

signal.signal(signal.SIGTERM, stop)
end = time.time() + 180
while not (os.path.exists(os.environ["GANG_GO"]) and step >= start + 3):
    if time.time() > end:
        sys.exit(1)
    step += 1
    save()
    time.sleep(0.2 if rank == 0 else 0.35)
os.makedirs("out", exist_ok=True)
with open("out/result.txt", "w") as f:
    f.write(f"rank {rank} from {start} to {step}\n")
"""


def _snapshot(script: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("rank.py")
        info.size = len(script.encode())
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(script.encode()))
    return buf.getvalue()


def _step_in(archive: bytes) -> str:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        member = tar.extractfile("step")
        assert member is not None
        return member.read().decode()


def _lines(api: httpx.Client, task_id: str, rank: int, attempt: int) -> list[str]:
    chunks = api.get(f"/api/v1/tasks/{task_id}/logs", params={"rank": rank}).json()
    return [line for c in chunks if c["attempt"] == attempt for line in c["data"].splitlines()]


@pytest.mark.timeout(400)
def test_a_gang_carries_its_code_and_resumes_every_rank_from_its_own_checkpoint(tmp_path: Path) -> None:
    with local_up(tmp_path, reconcile={"interval_s": 2, "heartbeat_timeout_s": 15}, stop_timeout_s=15) as up:
        api, home, log = up.api, up.home, up.log
        snap = api.post(
            "/api/v1/snapshots",
            params={"team": "vision"},
            content=_snapshot(RANK),
            headers={"Content-Type": "application/gzip"},
        )
        assert snap.status_code == 201, snap.text
        go = tmp_path / "go"
        reply = api.post(
            "/api/v1/tasks",
            json={
                "queue": "gpu",
                "gpus": 2,
                "nodes": 2,
                "team": "vision",
                "command": [sys.executable, "rank.py"],
                "code": {"snapshot": snap.json()["digest"]},
                "outputs": ["out/result.txt"],
                "checkpoint_dir": "ckpt",
                "checkpoint_every_s": 10,
                "env": {"GANG_GO": str(go)},
            },
        )
        assert reply.status_code == 201, reply.text
        task_id = reply.json()["id"]

        def artifacts() -> list[dict[str, Any]]:
            rows: list[dict[str, Any]] = api.get(f"/api/v1/tasks/{task_id}/artifacts").json()
            return rows

        def both_checkpointed() -> bool:
            ranks = {a["rank"] for a in artifacts() if a["kind"] == "checkpoint" and a["attempt"] == 1}
            return ranks == {0, 1}

        _until("both ranks' first periodic checkpoint", both_checkpointed, 120, log)
        kill_rank_agent(api, home, task_id, 1)
        after = until_requeued(api, task_id, 90, log)
        assert after["failures"] == 0 and after["end_reason"].startswith("lost:")

        def resumed_lines() -> dict[int, list[str]] | None:
            lines = {rank: _lines(api, task_id, rank, 2) for rank in (0, 1)}
            return lines if all(any(x.startswith("RESUMED") for x in ls) for ls in lines.values()) else None

        lines = _until("both ranks of attempt 2 to resume", resumed_lines, 120, log)
        rows = artifacts()  # before attempt 2 completes a generation (and the older ones go)
        # Each rank of attempt 2 restored rank R's file of ONE generation of attempt 1.
        restored: dict[int, dict[str, Any]] = {}
        resumed: dict[int, int] = {}
        for rank in (0, 1):
            note = next(line for line in lines[rank] if "checkpoint: restored" in line)
            digest = note.split("restored ")[1].split()[0]
            restored[rank] = next(a for a in rows if a["digest"] == digest and a["kind"] == "checkpoint")
            got = next(line for line in lines[rank] if line.startswith("RESUMED")).split()
            assert got[1] == str(rank) and got[3] == "2", got
            resumed[rank] = int(got[2])
        assert {r: (a["rank"], a["attempt"]) for r, a in restored.items()} == {0: (0, 1), 1: (1, 1)}
        assert restored[0]["generation"] == restored[1]["generation"] >= 1, restored
        for rank, art in restored.items():
            body = api.get(
                f"/api/v1/tasks/{task_id}/artifacts/{art['name']}",
                params={"attempt": 1, "generation": art["generation"]},
            ).content
            assert _step_in(body) == f"{rank} {resumed[rank]}"  # its own counter, as stored
        assert resumed[0] > 0 and resumed[1] > 0 and resumed[0] != resumed[1], resumed
        # Rank 0, stopped when rank 1 was lost, stored a newer generation alone: not restored.
        gens0 = {a["generation"] for a in rows if a["kind"] == "checkpoint" and a["rank"] == 0 and a["attempt"] == 1}
        assert max(gens0) > restored[0]["generation"], (gens0, restored)

        go.write_text("")
        done = ("succeeded", "failed", "canceled")

        def ended() -> str | None:
            state = str(api.get(f"/api/v1/tasks/{task_id}").json()["state"])
            return state if state in done else None

        assert _until("the gang to end", ended, 120, log) == "succeeded"
        final = api.get(f"/api/v1/tasks/{task_id}").json()
        assert final["attempts"] == 2 and final["failures"] == 0
        rows = artifacts()
        outputs = {(a["name"], a["attempt"]) for a in rows if a["kind"] == "output"}
        assert {("rank-0/out/result.txt", 2), ("rank-1/out/result.txt", 2)} <= outputs
        for rank in (0, 1):
            text = api.get(f"/api/v1/tasks/{task_id}/artifacts/rank-{rank}/out/result.txt").text
            assert text.startswith(f"rank {rank} from {resumed[rank]} to "), text
        # Attempt 2's stop-time generation is complete: what it replaced is gone.
        kept = {(a["attempt"], a["rank"]) for a in rows if a["kind"] == "checkpoint"}
        assert kept == {(2, 0), (2, 1)}, rows
