"""Request and response bodies of the HTTP API (pydantic). Bounds here are the first
line of defence against hostile input: every string and list has a maximum size."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator, model_validator

from autoscaler.auth.sealing import mask

NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
ENV_KEY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]{0,127}$"
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
# What each pattern asks for, in words: a 422 for a mismatch says this instead of the regex.
PATTERN_WORDS = {
    NAME_PATTERN: "a name: lowercase letters, digits, '.', '_' and '-', starting with a letter or digit, "
    "at most 63 characters",
    ENV_KEY_PATTERN: "a variable name: letters, digits and '_', not starting with a digit",
    DIGEST_PATTERN: "a digest: 'sha256:' and 64 lowercase hex digits",
}

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
Arg = Annotated[str, StringConstraints(max_length=8192)]
EnvKey = Annotated[str, StringConstraints(pattern=ENV_KEY_PATTERN)]
EnvValue = Annotated[str, StringConstraints(max_length=32768)]
# Secret env as everyone but the leasing worker sees it: the names, each value `***`.
# Masking is part of the type, so no response built from a task can carry a value.
MaskedEnv = Annotated[dict[str, str], BeforeValidator(mask)]


Digest = Annotated[str, StringConstraints(pattern=DIGEST_PATTERN)]
# A path inside the task's directory, as a task names its outputs and checkpoint dir.
TaskPath = Annotated[str, StringConstraints(min_length=1, max_length=1024)]


class Body(BaseModel):
    # NaN and infinity (which Python's JSON reader accepts) are refused as not finite,
    # rather than compared against a bound and refused as "greater than" it.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Out(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class QueueIn(Body):
    name: Name
    pools: list[Name] = Field(min_length=1, max_length=32)
    priority: int = Field(0, ge=-1000, le=1000)
    teams: list[Name] = Field(default_factory=list, max_length=256)


class QueueOut(Out):
    name: str
    pools: list[str]
    priority: int
    teams: list[str]
    depth: int = 0
    running: int = 0
    oldest_wait_s: float | None = None


class CodeIn(Body):
    """The code a task runs, fetched into its directory before the setup and command:
    an uploaded snapshot (POST /api/v1/snapshots), or a git repository at a ref with,
    optionally, an uncommitted diff uploaded as a snapshot."""

    snapshot: Digest | None = Field(None, description="Digest of a snapshot this team uploaded.")
    git: Annotated[str, StringConstraints(min_length=1, max_length=2048)] | None = Field(
        None, description="Repository URL the worker clones (as the task user)."
    )
    ref: Annotated[str, StringConstraints(min_length=1, max_length=256)] | None = Field(
        None, description="Commit, branch or tag to check out; default the remote's HEAD."
    )
    diff_snapshot: Digest | None = Field(None, description="A snapshot holding `diff.patch`, applied after checkout.")

    @model_validator(mode="after")
    def _one_source(self) -> CodeIn:
        if (self.snapshot is None) == (self.git is None):
            raise ValueError('give code as {"snapshot": DIGEST} or as {"git": URL, "ref": REF}, exactly one')
        if self.snapshot is not None and (self.ref is not None or self.diff_snapshot is not None):
            raise ValueError("ref and diff_snapshot go with git, not with a snapshot")
        if self.git is not None and self.git.startswith("-"):
            raise ValueError(f"{self.git!r} is not a repository URL")
        return self


class TaskIn(Body):
    queue: Name
    command: list[Arg] = Field(min_length=1, max_length=4096)
    gpus: int = Field(0, ge=0, le=64, description="GPUs per node.")
    nodes: int = Field(
        1,
        ge=1,
        le=256,
        description="Machines the task runs on at once, `gpus` on each: all ranks start together or none does "
        "(docs/gangs.md). 1: a single-node task.",
    )
    # Empty strings are refused, not read as "not given": an unset shell variable
    # (`--image "$IMAGE"`) must not quietly run the task on the machine instead.
    gpu_type: Annotated[str, StringConstraints(min_length=1, max_length=64)] | None = None
    cpus: float = Field(0, ge=0, le=1024)
    memory_mb: int = Field(0, ge=0, le=16 * 1024 * 1024)
    env: dict[EnvKey, EnvValue] = Field(default_factory=dict, max_length=256)
    secret_env: dict[EnvKey, EnvValue] = Field(
        default_factory=dict,
        max_length=256,
        description="Like env, but sealed at rest and shown as *** everywhere except to the worker that leases "
        "the task. A name may not be in both env and secret_env.",
    )
    working_dir: Annotated[str, StringConstraints(min_length=1, max_length=1024)] | None = None
    image: Annotated[str, StringConstraints(min_length=1, max_length=512)] | None = Field(
        None,
        description="An OCI image (e.g. registry.example/team/train:1.2): the agent pulls it and runs the "
        "command in a container with the task's GPUs only. Null: the command runs on the machine itself.",
    )
    image_pull_secret: EnvKey | None = Field(
        None,
        description="The name of a secret_env entry holding the registry login for `image`: `user:password` "
        "or a registry auth JSON. Used for the pull only; not passed to the container.",
    )
    priority: int = Field(0, ge=-1000, le=1000)
    max_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="Failed attempts (non-zero exit, timeout) before the task fails for good, the first one "
        "included; attempts ended by the machine (spot, drain, lost worker) never count.",
    )
    retry_on_exit_codes: list[int] | None = Field(
        None,
        max_length=64,
        description="Only these exit codes (1-255; 128+N for a death by signal N) are retried; other exits "
        "and timeouts fail at once. Null: every non-zero exit and every timeout is retried.",
    )
    timeout_s: float | None = Field(None, gt=0, le=30 * 86400)
    team: Name | None = Field(None, description="Admins only: enqueue on behalf of a team.")
    code: CodeIn | None = Field(None, description="Code fetched into the task's directory before it starts.")
    setup: Annotated[str, StringConstraints(min_length=1, max_length=8192)] | None = Field(
        None, description="A shell command run in the task's directory and environment before the command."
    )
    outputs: list[TaskPath] = Field(
        default_factory=list,
        max_length=64,
        description="Paths in the task's directory uploaded when an attempt ends, however it ends.",
    )
    checkpoint_dir: TaskPath | None = Field(
        None,
        description="A directory in the task's directory uploaded when the task is stopped and every "
        "checkpoint_every_s, and restored into the next attempt before it starts.",
    )
    checkpoint_every_s: int | None = Field(None, ge=10, le=7 * 86400)
    checkpoints: Annotated[str, StringConstraints(max_length=32)] | None = Field(
        None,
        description="What the task survives: `none` (a reclaim restarts it from zero), `on-signal` (it "
        "checkpoints on the reclaim notice) or `every:MIN` (it checkpoints every MIN minutes). Default: none, or "
        "on-signal with a checkpoint_dir. The planner weighs spot against on-demand with it (docs/capacity.md).",
    )
    expected_runtime_s: float | None = Field(
        None,
        gt=0,
        le=365 * 86400,
        description="How long the task runs, in seconds. Null: estimated from earlier runs of the same command.",
    )

    @field_validator("command")
    @classmethod
    def _program(cls, command: list[str]) -> list[str]:
        # An empty program name can never start: refused here, not failed on a worker.
        if not command[0].strip():
            raise ValueError("the program (the first word of the command) is empty; give e.g. ['python', 'train.py']")
        return command

    @field_validator("retry_on_exit_codes")
    @classmethod
    def _exit_codes(cls, codes: list[int] | None) -> list[int] | None:
        for c in codes or []:
            if not 1 <= c <= 255:
                raise ValueError(
                    f"{c} is not an exit code 1-255 (a process killed by signal N counts as 128+N, "
                    "e.g. 137 for SIGKILL)"
                )
        return codes

    @model_validator(mode="after")
    def _names_once(self) -> TaskIn:
        both = sorted(set(self.env) & set(self.secret_env))
        if both:
            raise ValueError(f"{', '.join(both)} given both in env and in secret_env; give each name once")
        return self


class TaskOut(Out):
    id: str
    queue: str
    team: str
    command: list[str]
    env: dict[str, str]
    secret_env: MaskedEnv = Field(default_factory=dict, description="Names of the secret env; values are ***.")
    working_dir: str | None
    image: str | None = None
    image_pull_secret: str | None = None
    gpus: int
    nodes: int = 1
    gpu_type: str | None
    cpus: float
    memory_mb: int
    priority: int
    max_attempts: int
    retry_on_exit_codes: list[int] | None
    timeout_s: float | None
    state: str
    attempts: int = Field(description="Leases so far: every attempt, whatever ended it.")
    failures: int = Field(
        description="Failed attempts (non-zero exit, timeout, start failure): what max_attempts bounds."
    )
    interruptions: int = Field(
        description="Attempts ended by the machine (spot, drain, lost worker, expired lease): they never count."
    )
    worker_id: str | None
    gpu_indices: list[int]
    exit_code: int | None
    end_reason: str | None
    # Set while the task is queued but no pool of its queue can ever run it (the
    # config changed under it); cleared when a later config can.
    unschedulable_reason: str | None = None
    cancel_requested: bool
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    # What the task cost so far, over all its attempts (the ledger's share of the
    # machines it held, accrued each reconcile cycle).
    cost_usd: float = 0.0
    gpu_hours: float = 0.0
    code: dict[str, Any] | None = None
    setup: str | None = None
    outputs: list[str] | None = None
    checkpoint_dir: str | None = None
    checkpoint_every_s: int | None = None
    checkpoints: str | None = Field(None, description="none (null), on-signal or every:MIN, as declared.")
    expected_runtime_s: float | None = Field(None, description="The declared run time (seconds), or null.")
    runtime_estimate: dict[str, Any] | None = Field(
        None,
        description="The run time the planner uses: mean_h, p10_h, p90_h, runs (of history) and source "
        "(declared, history or prior), made at enqueue.",
    )


class TaskAttemptOut(Out):
    attempt: int
    worker_id: str | None
    instance_id: str | None
    gpus: int
    started_at: datetime
    ended_at: datetime | None
    cost_usd: float
    gpu_hours: float


class TaskEventOut(Out):
    at: datetime
    from_state: str | None
    to_state: str
    reason: str
    attempt: int
    worker_id: str | None
    detail: str


class TaskRankOut(Out):
    """One rank of a multi-node task's attempt."""

    attempt: int
    rank: int
    worker_id: str
    gpu_indices: list[int]
    state: str
    exit_code: int | None
    end_reason: str | None
    reserved_at: datetime
    started_at: datetime | None
    ended_at: datetime | None


class TaskDetail(TaskOut):
    events: list[TaskEventOut]
    attempt_costs: list[TaskAttemptOut] = []
    ranks: list[TaskRankOut] = Field(default_factory=list, description="A multi-node task's ranks, every attempt.")


class LogChunkOut(Out):
    id: int
    attempt: int
    rank: int = 0
    stream: str
    data: str
    at: datetime


class LogChunkIn(Body):
    stream: Literal["stdout", "stderr"]
    data: Annotated[str, StringConstraints(max_length=256 * 1024)]


class LogsIn(Body):
    chunks: list[LogChunkIn] = Field(max_length=256)


class GpuInfo(Body):
    index: int = Field(ge=0, le=63)
    uuid: Annotated[str, StringConstraints(max_length=128)] = ""
    model: Annotated[str, StringConstraints(max_length=128)] = ""
    memory_mb: int = Field(0, ge=0)
    driver_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    cuda_version: Annotated[str, StringConstraints(max_length=64)] | None = None
    simulated: bool = False


IdentityKey = Annotated[str, StringConstraints(min_length=1, max_length=32)]
IdentityValue = Annotated[str, StringConstraints(max_length=16384)]


class RegisterIn(Body):
    hostname: Annotated[str, StringConstraints(min_length=1, max_length=255)]
    instance_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    provider: Name
    pool: Name
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=64)
    cpus: int = Field(0, ge=0, le=4096)
    memory_mb: int = Field(0, ge=0)
    agent_version: Annotated[str, StringConstraints(max_length=32)] = ""
    # A random secret of this agent process: lets it retry a join whose answer it lost.
    retry_key: Annotated[str, StringConstraints(min_length=16, max_length=128)] | None = None
    # The cloud's signed statement of who this machine is (AWS: the instance identity
    # document and its signature); checked when the pool is configured to verify it.
    identity: dict[IdentityKey, IdentityValue] | None = Field(None, max_length=8)
    # The machine's private address (a gang's MASTER_ADDR when it holds rank 0).
    address: Annotated[str, StringConstraints(max_length=255, pattern=r"^[A-Za-z0-9.:\-\[\]%]*$")] | None = None


class RegisterOut(BaseModel):
    worker_id: str
    worker_token: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    # This server records a heartbeat carried by a lease (LeaseIn.heartbeat): an idle
    # agent may send its heartbeat with its long-poll instead of on its own.
    heartbeat_in_lease: bool = True
    # This server takes a finish's last output in the finish (FinishIn.logs).
    finish_with_logs: bool = True


class GpuMetric(Body):
    index: int = Field(ge=0, le=63)
    utilization_pct: float = Field(0, ge=0, le=100)
    memory_used_mb: float = Field(0, ge=0)
    memory_total_mb: float = Field(0, ge=0)
    temperature_c: float | None = None
    error: Annotated[str, StringConstraints(max_length=256)] | None = None


class HeartbeatIn(Body):
    gpu_metrics: list[GpuMetric] = Field(default_factory=list, max_length=64)
    running: list[Annotated[str, StringConstraints(max_length=64)]] = Field(default_factory=list, max_length=64)
    draining: bool = False
    preempted: bool = Field(False, description="The agent got a spot/preemption notice from its cloud.")
    preempt_reason: str = Field(
        "", max_length=255, description="The notice in the cloud's words (recorded in the instance's history)."
    )
    preempt_deadline: datetime | None = Field(None, description="When the cloud takes the machine, if it says.")


class HeartbeatOut(BaseModel):
    drain: bool
    drain_deadline: datetime | None
    cancel: list[str]
    reclaim: list[str] = []
    shutdown: bool


class LeasedTaskOut(TaskOut):
    """The task as its leasing worker gets it: the one place secret_env has its values."""

    secret_env: dict[str, str] = Field(
        default_factory=dict, description="The secret env, opened: the agent adds it to the task's environment."
    )
    transfers: TransfersOut | None = None


class TransfersOut(BaseModel):
    """Where the leasing worker fetches and stores this attempt's files: task-scoped,
    short-lived URLs (presigned by the store, or the server's own transfer endpoint
    with a ticket in the path; a path starting with / is relative to the server)."""

    code_url: str | None = None
    code_digest: str | None = None
    checkpoint_url: str | None = None
    checkpoint_digest: str | None = None
    output_urls: dict[str, str] = Field(default_factory=dict)
    checkpoint_upload_url: str | None = None


class LeaseIn(Body):
    heartbeat: HeartbeatIn | None = Field(
        None,
        description="An idle agent's heartbeat, carried by its (long-poll) lease instead of a request of its "
        "own: recorded exactly as POST /heartbeat records it, before the lease; the reply's `heartbeat` "
        "holds what that endpoint would answer.",
    )


class LeaseOut(BaseModel):
    task: LeasedTaskOut | None
    # No task, but this worker holds a rank of a gang that is still forming: its start
    # comes on a later lease, so the agent asks again soon (docs/gangs.md).
    reserved: bool = False
    # The heartbeat's reply when the request carried one (LeaseIn.heartbeat).
    heartbeat: HeartbeatOut | None = None


class FinishIn(Body):
    reason: Literal["exit", "canceled", "interrupted", "timeout", "start_failed"]
    exit_code: int | None = Field(None, ge=-255, le=255)
    detail: Annotated[str, StringConstraints(max_length=2000)] = ""
    # The attempt's last output, kept as POST /logs keeps it, before the finish and in
    # its transaction: a short task's end is one request, not two.
    logs: list[LogChunkIn] = Field(default_factory=list, max_length=256)


class DrainIn(Body):
    deadline_s: float = Field(600, ge=0, le=7 * 86400)
    only_if_idle: bool = False
    reason: Annotated[str, StringConstraints(max_length=64)] = "admin"


class WorkerOut(Out):
    id: str
    hostname: str
    instance_id: str
    provider: str
    pool: str
    state: str
    gpus: list[dict[str, Any]]
    gpu_count: int
    gpu_type: str | None
    simulated_gpus: bool
    cpus: int
    memory_mb: int
    gpu_metrics: list[dict[str, Any]]
    registered_at: datetime
    last_heartbeat: datetime
    drain_deadline: datetime | None
    gone_reason: str | None


class InstanceOut(Out):
    id: str
    request_id: str
    provider: str
    pool: str
    instance_type: str
    capacity_type: str
    zone: str | None
    region: str | None
    gpus: int
    gpu_type: str | None
    provider_instance_id: str | None
    state: str
    team: str | None
    hourly_price: float
    worker_id: str | None
    last_error: str | None
    created_at: datetime
    launched_at: datetime | None
    ready_at: datetime | None
    terminated_at: datetime | None


class GpuPointOut(BaseModel):
    at: datetime
    attempt: int
    utilization_pct: float = Field(description="Mean over the attempt's GPUs.")
    memory_used_mb: float = Field(description="Summed over the attempt's GPUs.")
    memory_total_mb: float
    per_gpu: dict[int, float] = Field(description="GPU index on the worker -> utilisation %.")


class TaskGpuOut(BaseModel):
    """A task's GPU use: its worker's samples for the GPUs and time each attempt held."""

    task_id: str
    samples: int = Field(description="Sample instants found (points may be thinned to at most 500 per attempt).")
    mean_utilization_pct: float | None
    peak_memory_used_mb: float | None
    memory_total_mb: float | None
    sample_interval_s: float
    retention_days: float
    points: list[GpuPointOut]


class TaskWhyOut(BaseModel):
    task_id: str
    state: str
    code: str
    reason: str
    details: dict[str, Any]
    capacity: dict[str, Any] | None = Field(
        None,
        description="For a queued task: spot or on-demand as the planner would choose now, with the expected "
        "costs and the reason (docs/capacity.md).",
    )


class DecisionOut(Out):
    id: int
    at: datetime
    policy_revision: str
    input_digest: str
    eval_ms: float
    cycle_ms: float
    summary: dict[str, Any]
    result: dict[str, Any]
    plan: dict[str, Any]
    reasons: list[Any]
    error: str | None


class PoolOut(BaseModel):
    name: str
    provider: str
    region: str
    zones: list[str]
    capacity_types: list[str]
    min_instances: int
    max_instances: int
    idle_timeout_s: float
    warm_pool: str = "adaptive"
    boot_timeout_s: float
    instances: int = 0


class TokenIn(Body):
    kind: Literal["team", "join", "admin"]
    team: Name | None = None
    pool: Name | None = None
    ttl_s: float | None = Field(None, gt=0, le=366 * 86400)
    name: Annotated[str, StringConstraints(max_length=128)] = ""


class TokenOut(BaseModel):
    id: str
    kind: str
    token: str
    team: str | None
    pool: str | None
    expires_at: datetime | None


class WhoAmI(BaseModel):
    kind: str
    team: str | None
    pool: str | None
    worker_id: str | None


class SnapshotOut(BaseModel):
    digest: str
    size: int


class ArtifactOut(Out):
    name: str  # a gang's rank's: under rank-R/
    kind: Literal["output", "checkpoint"]
    size: int
    digest: str
    attempt: int
    created_at: datetime
    rank: int | None = None  # the gang's rank that left it; None: a single-node task's
    generation: int = 0  # a gang's checkpoint: the k-th checkpoint point of its attempt
