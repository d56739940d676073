"""The JSON the agent exchanges with the control plane.

These models mirror `autoscaler.api.schemas` on purpose instead of importing it: the
agent runs on a VM image that should not carry the server's code paths. A contract
test (`tests/agent/test_wire_contract.py`) checks both sides still agree. Responses
ignore unknown fields so a newer server can add some without breaking older agents.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

EndReason = Literal["exit", "canceled", "interrupted", "timeout", "start_failed"]


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GpuInfo(BaseModel):
    index: int
    uuid: str = ""
    model: str = ""
    memory_mb: int = 0
    driver_version: str | None = None
    cuda_version: str | None = None
    simulated: bool = False


class GpuMetric(BaseModel):
    index: int
    utilization_pct: float = 0
    memory_used_mb: float = 0
    memory_total_mb: float = 0
    temperature_c: float | None = None
    error: str | None = None


class RegisterBody(BaseModel):
    hostname: str
    instance_id: str
    provider: str
    pool: str
    gpus: list[GpuInfo] = Field(default_factory=list)
    cpus: int = 0
    memory_mb: int = 0
    agent_version: str = ""
    retry_key: str | None = None
    identity: dict[str, str] | None = None
    address: str | None = None


class Registered(_Reply):
    worker_id: str
    worker_token: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    # The server records a heartbeat carried by a lease (servers before it do not say so).
    heartbeat_in_lease: bool = False
    finish_with_logs: bool = False  # the server takes a finish's last output in the finish


class HeartbeatBody(BaseModel):
    gpu_metrics: list[GpuMetric] = Field(default_factory=list)
    running: list[str] = Field(default_factory=list)
    draining: bool = False
    preempted: bool = False
    # The cloud's words and deadline, once preempted: the instance's history records them.
    preempt_reason: str = ""
    preempt_deadline: datetime | None = None


class Commands(_Reply):
    """What the server asks of the agent in a heartbeat reply."""

    drain: bool = False
    drain_deadline: datetime | None = None
    cancel: list[str] = Field(default_factory=list)
    # Tasks whose GPUs a lender takes back (quota): stop them as at a spot notice.
    reclaim: list[str] = Field(default_factory=list)
    shutdown: bool = False


class Transfers(_Reply):
    """Task-scoped, short-lived URLs for this attempt's files (a path starting with / is
    on the server); never a credential of the store."""

    code_url: str | None = None
    code_digest: str | None = None
    checkpoint_url: str | None = None
    checkpoint_digest: str | None = None
    output_urls: dict[str, str] = Field(default_factory=dict)
    checkpoint_upload_url: str | None = None


class LeasedTask(_Reply):
    id: str
    command: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    # Opened by the server for this lease only; merged into the process environment,
    # never logged or written to disk by the agent (repr=False keeps it out of reprs).
    secret_env: dict[str, str] = Field(default_factory=dict, repr=False)
    working_dir: str | None = None
    # Run in this OCI image through the machine's engine (autoscaler.agent.container);
    # image_pull_secret names the secret_env entry holding the registry login.
    image: str | None = None
    image_pull_secret: str | None = None
    # Limits for a container task (--cpus, --memory); a plain task is not limited.
    cpus: float = 0
    memory_mb: int = 0
    gpus: int = 0
    gpu_indices: list[int] = Field(default_factory=list)
    timeout_s: float | None = None
    attempts: int = 1
    # What the task carries: fetched before it starts, saved when it ends (agent/carry.py).
    code: dict[str, str | None] | None = None
    setup: str | None = None
    outputs: list[str] | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_s: int | None = None
    transfers: Transfers | None = Field(None, repr=False)


class LeaseReply(_Reply):
    task: LeasedTask | None = None
    reserved: bool = False  # this worker holds a rank of a forming gang
    heartbeat: Commands | None = None  # the reply to a heartbeat the lease carried


class LogChunk(BaseModel):
    stream: Literal["stdout", "stderr"]
    data: str


class FinishBody(BaseModel):
    reason: EndReason
    exit_code: int | None = None
    detail: str = ""
    logs: list[LogChunk] = Field(default_factory=list)  # only to a server that takes them
