"""What the tests of tasks that carry files share, plain and in containers
(test_carry.py, test_container_carry.py): a team client, a snapshot uploaded from a
directory that is then deleted, an artifact's bytes, and a spot reclaim sent through
the fake metadata service to a task that checkpoints on SIGTERM."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from autoscaler.workload.snapshot import pack_directory
from tests.agent.conftest import AgentHarness, AgentProcess, wait_for
from tests.conftest import issue_token
from tests.fakes.metadata import FakeMetadata


def vision(h: AgentHarness) -> httpx.Client:
    """A client with a team token of `vision`, the team `AgentHarness.enqueue` uses."""
    token = issue_token(h.ctx, "team", team="vision")
    return httpx.Client(base_url=h.server.url, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def upload_dir(h: AgentHarness, root: Path) -> str:
    """Pack `root`, upload it as vision's snapshot and delete it: from here on the code
    exists only in the store. Returns the digest (the one the client packed)."""
    packed = pack_directory(root, limit_bytes=10**7)
    try:
        r = vision(h).post("/api/v1/snapshots", content=packed.path.read_bytes())
    finally:
        packed.path.unlink()
    assert r.status_code == 201, r.text
    assert r.json()["digest"] == packed.digest  # what the client packed is what the server keeps
    shutil.rmtree(root)
    return str(packed.digest)


def artifact(h: AgentHarness, task_id: str, name: str) -> bytes:
    r = vision(h).get(f"/api/v1/tasks/{task_id}/artifacts/{name}")
    assert r.status_code == 200, r.text
    return r.content


@contextmanager
def spot_metadata() -> Iterator[FakeMetadata]:
    """AWS's instance metadata for a spot instance whose reclaim notice is armed at will;
    an agent reads it with `spot_flags(metadata)`."""
    metadata = FakeMetadata("aws", instance_id="i-spot").start()
    try:
        yield metadata
    finally:
        metadata.stop()


def spot_flags(metadata: FakeMetadata) -> list[str]:
    return ["--provider", "aws", "--metadata-url", metadata.url]


def reclaim(h: AgentHarness, task_id: str, metadata: FakeMetadata, agent: AgentProcess, *, timeout: float) -> int:
    """Let the running task (it prints "starting at step N" and, on SIGTERM,
    "checkpointed at step N") count a few steps, send the spot notice and wait for the
    agent to leave. Returns the step its checkpoint reached; the task is queued again."""
    wait_for("the task to count", lambda: "starting at step 0" in h.logs(task_id), timeout=timeout)
    wait_for("notice polls", lambda: metadata.polls() >= 2)
    time.sleep(1.0)  # let it count past a few steps
    metadata.arm()
    assert agent.wait(timeout) == 0, agent.log()
    first = h.task(task_id)
    assert first["state"] == "queued" and first["events"][-2]["reason"] == "interrupted:spot", first["events"]
    reached = int(h.logs(task_id).split("checkpointed at step ")[1].split()[0])
    assert reached > 0
    return reached
