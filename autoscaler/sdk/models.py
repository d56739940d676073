"""Typed views of the server's replies. Unknown fields are ignored, so an SDK keeps
working against a newer server; `raw` keeps the reply exactly as it came (what the
CLI's `--json` prints)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from autoscaler.lifecycle import TASK_FINAL

# States after which a task never runs again (lifecycle.py is pure: no server code).
TERMINAL_STATES = TASK_FINAL


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    _raw: dict[str, Any] = PrivateAttr(default_factory=dict)

    @classmethod
    def parse(cls, data: dict[str, Any]) -> Any:
        reply = cls.model_validate(data)
        reply._raw = data
        return reply

    @property
    def raw(self) -> dict[str, Any]:
        return self._raw


class TaskEvent(_Reply):
    at: datetime
    from_state: str | None
    to_state: str
    reason: str
    attempt: int
    worker_id: str | None
    detail: str


class TaskInfo(_Reply):
    """A task as `GET /api/v1/tasks/{id}` shows it (`events` only in that reply)."""

    id: str
    queue: str
    team: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: dict[str, str] = Field(default_factory=dict)  # values are always ***
    working_dir: str | None = None
    gpus: int
    nodes: int = 1  # machines it runs on at once (a gang: `gpus` on each)
    gpu_type: str | None = None
    cpus: float = 0
    memory_mb: int = 0
    priority: int = 0
    max_attempts: int
    retry_on_exit_codes: list[int] | None = None
    timeout_s: float | None = None
    state: str
    attempts: int = 0
    failures: int = 0
    interruptions: int = 0
    worker_id: str | None = None
    exit_code: int | None = None
    end_reason: str | None = None
    unschedulable_reason: str | None = None
    cancel_requested: bool = False
    created_at: datetime
    finished_at: datetime | None = None
    cost_usd: float = 0.0
    gpu_hours: float = 0.0
    # What it survives (None: none), its declared run time (seconds) and the run-time
    # estimate the planner uses (mean_h, p10_h, p90_h, runs, source).
    checkpoints: str | None = None
    expected_runtime_s: float | None = None
    runtime_estimate: dict[str, Any] | None = None
    events: list[TaskEvent] = Field(default_factory=list)

    @property
    def done(self) -> bool:
        return self.state in TERMINAL_STATES


class LogChunk(_Reply):
    id: int
    attempt: int
    rank: int = 0  # which rank of a multi-node task wrote it
    stream: str  # "stdout" or "stderr"
    data: str
    at: datetime


class WhyAnswer(_Reply):
    """Why a task waits now: a stable `code` to branch on and a `reason` for people."""

    task_id: str
    state: str
    code: str
    reason: str
    details: dict[str, Any] = Field(default_factory=dict)
    # Spot or on-demand as the planner would choose now, with the numbers (queued only).
    capacity: dict[str, Any] | None = None


class Artifact(_Reply):
    """An output or checkpoint a task left (`GET /api/v1/tasks/{id}/artifacts`)."""

    name: str
    kind: str  # "output" or "checkpoint"
    size: int
    digest: str
    attempt: int
    created_at: datetime
    # A multi-node task's: the rank that left it (its name starts rank-R/), and for a
    # checkpoint its generation (docs/gangs.md). None / 0 for a single-node task's.
    rank: int | None = None
    generation: int = 0


class Snapshot(_Reply):
    """A code snapshot the server stored (`POST /api/v1/snapshots`)."""

    digest: str
    size: int


@dataclass(frozen=True)
class SnapshotCode:
    """Run the task in an uploaded code snapshot (`Client.upload_snapshot`)."""

    digest: str

    def to_json(self) -> dict[str, Any]:
        return {"snapshot": self.digest}


@dataclass(frozen=True)
class GitCode:
    """Run the task in a checkout of `url` at `ref`, with an uploaded diff on top if given."""

    url: str
    ref: str
    diff_snapshot: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"git": self.url, "ref": self.ref, "diff_snapshot": self.diff_snapshot}


CodeSource = SnapshotCode | GitCode
