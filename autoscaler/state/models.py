"""SQLAlchemy 2.0 typed models: every table the control plane keeps.

Times are stored as timezone-aware UTC on both SQLite and PostgreSQL (`UTCDateTime`).
Every state change of a task or an instance appends a history row (`TaskEvent`,
`InstanceEvent`) with the reason, so "why did this happen" is always answerable.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator


def _random_id() -> str:
    return uuid.uuid4().hex


# Where `new_id` gets its ids. A context variable, not a module global, so a simulation
# seeding its ids in one thread never touches ids made by a server in another.
_id_factory: ContextVar[Callable[[], str]] = ContextVar("autoscaler_id_factory", default=_random_id)


def new_id() -> str:
    """A fresh id (32 hex digits) for a primary key or a launch request id.

    A random uuid4, except inside `seeded_ids`. Ids break ties in lease order and in
    unordered listings, so a simulation needs them reproducible across processes.
    """
    return _id_factory.get()()


@contextmanager
def seeded_ids(seed: int) -> Iterator[None]:
    """Within the block (this thread or task only), `new_id` draws uuid4-shaped ids from
    a generator seeded with `seed`: the same seed gives the same ids in any process.
    The previous factory is restored on exit, so blocks nest and may run one after
    another in a process. For the simulator; production never enters one."""
    # A string seed is hashed with SHA-512 by `random`, never with `hash()`, so it does
    # not depend on PYTHONHASHSEED; the prefix keeps this stream apart from other
    # generators seeded with the same number.
    rng = random.Random(f"autoscaler.new_id/{seed}")

    def seeded() -> str:
        return uuid.UUID(int=rng.getrandbits(128), version=4).hex

    token = _id_factory.set(seeded)
    try:
        yield
    finally:
        _id_factory.reset(token)


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in and out, whatever the backend keeps."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSON, list[Any]: JSON}


class ApiToken(Base):
    """A bearer token, stored as its SHA-256 only. Kinds: admin, team, join, worker."""

    __tablename__ = "api_tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    kind: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16), default="")
    name: Mapped[str] = mapped_column(String(128), default="")
    team: Mapped[str | None] = mapped_column(String(64))
    pool: Mapped[str | None] = mapped_column(String(64))
    worker_id: Mapped[str | None] = mapped_column(String(32))
    # A join token is consumed by its first successful registration (`used_at`), which
    # binds it to that instance; any later presentation is a replay and is refused,
    # except the same agent process retrying a registration whose answer it lost
    # (it proves that with the retry key whose digest is kept here).
    bound_instance: Mapped[str | None] = mapped_column(String(128))
    used_at: Mapped[datetime | None]
    retry_key_hash: Mapped[str | None] = mapped_column(String(64))
    # What a join token minted for a launch expects: the launch's request id (hence its
    # Instance row and, once the provider reported it, the instance id) and provider.
    request_id: Mapped[str | None] = mapped_column(String(64))
    provider: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    # A gang launch's join token (one user-data for its k machines) registers up to
    # `max_uses` machines, each a distinct instance of that launch, once (`JoinUse`);
    # `uses` is how many did. Every other join token: 1, and `used_at` is the one use.
    max_uses: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    uses: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class JoinUse(Base):
    """One registration with a gang launch's join token: the instance it bound (unique
    per token, so the same machine cannot use it twice) and the retry key of the agent
    process that did, so that process may retry a registration whose answer it lost."""

    __tablename__ = "join_uses"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    token_id: Mapped[str] = mapped_column(String(32), ForeignKey("api_tokens.id", ondelete="CASCADE"))
    instance_id: Mapped[str] = mapped_column(String(128))
    worker_id: Mapped[str | None] = mapped_column(String(32))
    retry_key_hash: Mapped[str | None] = mapped_column(String(64))
    used_at: Mapped[datetime]

    __table_args__ = (UniqueConstraint("token_id", "instance_id", name="uq_join_uses_token_instance"),)


class SecurityEvent(Base):
    """A refused registration, a token replay or an authorization failure. Never holds
    a token: only the id of the token row when one was recognised."""

    __tablename__ = "security_events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    # registration_refused | join_replay | worker_token_replay | auth_failed | forbidden
    kind: Mapped[str] = mapped_column(String(32))
    client: Mapped[str] = mapped_column(String(64), default="")
    token_id: Mapped[str | None] = mapped_column(String(32))
    token_kind: Mapped[str | None] = mapped_column(String(16))
    pool: Mapped[str | None] = mapped_column(String(64))
    instance_id: Mapped[str | None] = mapped_column(String(128))
    worker_id: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(Text, default="")


class QueueRow(Base):
    __tablename__ = "queues"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    pools: Mapped[list[Any]] = mapped_column(default=list)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    teams: Mapped[list[Any]] = mapped_column(default=list)
    created_at: Mapped[datetime]


class Task(Base):
    __tablename__ = "tasks"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    queue: Mapped[str] = mapped_column(String(64), ForeignKey("queues.name"))
    team: Mapped[str] = mapped_column(String(64))
    command: Mapped[list[Any]]
    env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # Secret env: name -> value sealed with the server's key (autoscaler.auth.sealing),
    # never the value itself. Opened only for the worker that leases the task.
    secret_env: Mapped[dict[str, Any] | None] = mapped_column(default=dict)
    working_dir: Mapped[str | None] = mapped_column(String(1024))
    # The OCI image the task runs in (None: on the machine itself) and the name of the
    # secret_env entry holding its registry login.
    image: Mapped[str | None] = mapped_column(String(512), nullable=True)
    image_pull_secret: Mapped[str | None] = mapped_column(String(128), nullable=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    # Machines the task runs on at once (a gang: `gpus` on each; see queueing.gangs).
    nodes: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    cpus: Mapped[float] = mapped_column(Float, default=0)
    memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    # Failed attempts (non-zero exit, timeout, start failure) allowed before the task
    # fails for good; machine-caused ends never spend them (see `interruptions`).
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    # When set, only these exit codes are retried (a code 129-255 also matches a death
    # by signal code-128); None: every non-zero exit and every timeout is.
    retry_on_exit_codes: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    timeout_s: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16), default="queued")
    # Leases so far: every attempt, whatever ended it.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # Attempts ended by the machine (spot reclaim, drain, deregistration, lost
    # heartbeat, expired lease): they never count against max_attempts.
    interruptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Attempts the task itself failed (non-zero exit, timeout, start failure): these
    # are what max_attempts bounds.
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    worker_id: Mapped[str | None] = mapped_column(String(32))
    gpu_indices: Mapped[list[Any]] = mapped_column(default=list)
    lease_deadline: Mapped[datetime | None]
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(String(32))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    # A lender took back the quota this task borrowed: the worker is told to stop it
    # (interrupted:reclaim) and it is requeued. Cleared when the attempt ends.
    reclaim_requested: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    # Set while the task is queued but no pool of its queue could ever run it (the
    # config changed under it): why, in one line. The planner does not count it as
    # demand; cleared when a later config can run it again. See queueing.unschedulable.
    unschedulable_reason: Mapped[str | None] = mapped_column(String(500))
    # What the task carries (autoscaler.artifacts): its code ({"snapshot": digest} or
    # {"git": url, "ref": ref, "diff_snapshot": digest | None}), a setup command run
    # before it, paths uploaded when an attempt ends, and a checkpoint dir kept across
    # attempts (uploaded on stop and every checkpoint_every_s, restored at the start).
    code: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    setup: Mapped[str | None] = mapped_column(Text, nullable=True)
    outputs: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    checkpoint_dir: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    checkpoint_every_s: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # What the task survives (none | on-signal | every:MIN; NULL: none) and how long it
    # says it runs (NULL: not declared). `command_key` (a digest of the command) finds
    # earlier runs of the same work; `runtime_estimate` is the estimate made at enqueue
    # (autoscaler.planner.runtime_estimate) and `runtime_class_s` its mean rounded to a
    # quarter-octave, what the planner groups demand by (docs/capacity.md).
    checkpoints: Mapped[str | None] = mapped_column(String(32), nullable=True)
    expected_runtime_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    command_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    runtime_estimate: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    runtime_class_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Lease order within equal priorities; a requeued interrupted task keeps its
    # original sort key so it goes back to the head of its queue, a retried failed one
    # gets the time of its failure (behind the work already waiting).
    sort_key: Mapped[datetime]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_tasks_lease", "state", "queue", "priority", "sort_key"),
        Index("ix_tasks_team_state", "team", "state"),
        Index("ix_tasks_worker", "worker_id"),
        # The snapshot's demand query (GROUP BY shape over queued tasks) reads only
        # this index, in its order: no table lookup, no sort (migrations 0014, 0015, 0016).
        Index(
            "ix_tasks_demand",
            "state",
            "unschedulable_reason",
            "queue",
            "team",
            "gpus",
            "gpu_type",
            "priority",
            "cpus",
            "memory_mb",
            "runtime_class_s",
            "checkpoints",
            "end_reason",
            "sort_key",
            "nodes",
        ),
        Index("ix_tasks_history", "team", "queue", "command_key", "state"),
    )


class TaskEvent(Base):
    __tablename__ = "task_events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(32), ForeignKey("tasks.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(64))
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(Text, default="")


class TaskLog(Base):
    __tablename__ = "task_logs"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(32), ForeignKey("tasks.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    stream: Mapped[str] = mapped_column(String(8))
    data: Mapped[str] = mapped_column(Text)
    at: Mapped[datetime]
    # Which rank of a multi-node task wrote it (0 for a single-node task).
    rank: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (Index("ix_task_logs_task", "task_id", "id"),)


class TaskRank(Base):
    """One rank of a multi-node task's attempt: the worker it holds GPUs on, from its
    reservation to its end (states in `autoscaler.lifecycle.RankState`)."""

    __tablename__ = "task_ranks"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(32), ForeignKey("tasks.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    worker_id: Mapped[str] = mapped_column(String(32), index=True)
    gpu_indices: Mapped[list[Any]] = mapped_column(default=list)
    state: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    end_reason: Mapped[str | None] = mapped_column(String(64))
    reserved_at: Mapped[datetime]
    # When its worker was handed the start (a lease answer); None: not yet.
    delivered_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    ended_at: Mapped[datetime | None]

    __table_args__ = (
        Index("ix_task_ranks_task", "task_id", "attempt", "rank"),
        Index("ix_task_ranks_state", "state"),
    )


class Worker(Base):
    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    hostname: Mapped[str] = mapped_column(String(255))
    instance_id: Mapped[str] = mapped_column(String(128), index=True)
    provider: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(64), index=True)
    # Indexed: every cycle looks for live and draining workers among all that ever were.
    state: Mapped[str] = mapped_column(String(16), default="idle", index=True)
    gpus: Mapped[list[Any]] = mapped_column(default=list)
    gpu_count: Mapped[int] = mapped_column(Integer, default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    simulated_gpus: Mapped[bool] = mapped_column(Boolean, default=False)
    cpus: Mapped[int] = mapped_column(Integer, default=0)
    memory_mb: Mapped[int] = mapped_column(Integer, default=0)
    gpu_metrics: Mapped[list[Any]] = mapped_column(default=list)
    registered_at: Mapped[datetime]
    last_heartbeat: Mapped[datetime]
    idle_since: Mapped[datetime | None]
    drain_deadline: Mapped[datetime | None]
    drain_reason: Mapped[str | None] = mapped_column(String(64))
    # The private address the agent reported (a gang's MASTER_ADDR when it holds rank 0).
    address: Mapped[str | None] = mapped_column(String(255), nullable=True)
    gone_at: Mapped[datetime | None]
    gone_reason: Mapped[str | None] = mapped_column(String(64))
    agent_version: Mapped[str] = mapped_column(String(32), default="")
    # Its pool's tenancy when it registered: "team" (one team's work at a time) or "shared".
    tenancy: Mapped[str] = mapped_column(String(8), default="team", server_default="team")
    # Its pool's `unused_cost` when it registered: who pays for its free GPUs.
    unused_cost: Mapped[str] = mapped_column(String(8), default="launcher", server_default="launcher")


class Instance(Base):
    """One VM (or local process, or Slurm job) this deployment asked for."""

    __tablename__ = "instances"
    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    # The provider's idempotency key, committed before the provider is called.
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    provider: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(64), index=True)
    instance_type: Mapped[str] = mapped_column(String(64))
    capacity_type: Mapped[str] = mapped_column(String(16))
    zone: Mapped[str | None] = mapped_column(String(64))
    region: Mapped[str | None] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    provider_instance_id: Mapped[str | None] = mapped_column(String(128), index=True)
    state: Mapped[str] = mapped_column(String(16), default="requested", index=True)
    team: Mapped[str | None] = mapped_column(String(64))
    hourly_price: Mapped[float] = mapped_column(Float, default=0.0)
    # Indexed: a lease looks up the machine its worker runs on (the ledger's attribution).
    worker_id: Mapped[str | None] = mapped_column(String(32), index=True)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    launched_at: Mapped[datetime | None]
    ready_at: Mapped[datetime | None]
    terminated_at: Mapped[datetime | None]
    # One of the k machines of a gang launch: the launch's request id (the provider's
    # idempotency key and tag, the lead row's own `request_id`) and the gang (task id).
    # Both None for a single machine. Each row keeps a `request_id` of its own.
    launch_request_id: Mapped[str | None] = mapped_column(String(64), index=True)
    gang_id: Mapped[str | None] = mapped_column(String(32))
    # The smaller machines of its pool a GPU task waits for rather than take this one
    # whole ([[gpus, cpus, memory_mb], ...], `admission.right_size`); None: no rule.
    smaller_machines: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)


class InstanceEvent(Base):
    __tablename__ = "instance_events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(String(32), ForeignKey("instances.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime]
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(255))


class DecisionRecord(Base):
    """One reconcile cycle: what was seen, what the policy said, what was planned and done."""

    __tablename__ = "decisions"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    policy_revision: Mapped[str] = mapped_column(String(64), default="")
    input_digest: Mapped[str] = mapped_column(String(64), default="")
    eval_ms: Mapped[float] = mapped_column(Float, default=0.0)
    cycle_ms: Mapped[float] = mapped_column(Float, default=0.0)
    summary: Mapped[dict[str, Any]] = mapped_column(default=dict)
    result: Mapped[dict[str, Any]] = mapped_column(default=dict)
    plan: Mapped[dict[str, Any]] = mapped_column(default=dict)
    reasons: Mapped[list[Any]] = mapped_column(default=list)
    error: Mapped[str | None] = mapped_column(Text)


class TaskAttempt(Base):
    """Which machine a task held, and when: one row per attempt, from its lease to its end.

    Opened when the task enters `leased` and closed when it leaves `leased`/`running`
    (both in `queueing.states.transition`). The ledger charges each attempt its share of
    the machine's price for that time and keeps the running total here."""

    __tablename__ = "task_attempts"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(32), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    team: Mapped[str] = mapped_column(String(64))
    worker_id: Mapped[str | None] = mapped_column(String(32))
    # Resolved from the worker when the attempt opens, or by the ledger later.
    instance_id: Mapped[str | None] = mapped_column(String(32), index=True)
    gpus: Mapped[int] = mapped_column(Integer, default=0)
    # The worker's GPUs this attempt held (which of the worker's GPU samples are its).
    gpu_indices: Mapped[list[Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # Indexed: the snapshot counts the attempts started in the last hour (the warm pool).
    started_at: Mapped[datetime] = mapped_column(index=True)
    ended_at: Mapped[datetime | None] = mapped_column(index=True)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)


# `SpendRecord.kind`: time a task held (part of) the machine, or time with free capacity.
USAGE, UNUSED = "usage", "unused"


class SpendRecord(Base):
    """A priced segment: one instance's cost within one month charged to one team, either
    for the GPUs its tasks held (`kind="usage"`) or for the machine's free capacity
    (`kind="unused"`, charged to the launching team or to "shared"). `start`/`end` span
    the time the segment covers; `hours` is the machine-hours charged (cost / price)."""

    __tablename__ = "spend_records"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    instance_id: Mapped[str] = mapped_column(String(32), index=True)
    team: Mapped[str] = mapped_column(String(64), index=True)
    pool: Mapped[str] = mapped_column(String(64))
    provider: Mapped[str] = mapped_column(String(32))
    region: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(64))
    capacity_type: Mapped[str] = mapped_column(String(16))
    start: Mapped[datetime] = mapped_column(index=True)
    end: Mapped[datetime]
    hourly_price: Mapped[float] = mapped_column(Float)
    cost_usd: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(8), default=UNUSED, server_default=UNUSED)
    hours: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class OfferingBlock(Base):
    """An offering (or a wider scope) marked unavailable after a capacity or quota error."""

    __tablename__ = "offering_blocks"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    provider: Mapped[str] = mapped_column(String(32))
    pool: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(255))
    reason: Mapped[str] = mapped_column(Text)
    until: Mapped[datetime]


class GpuSample(Base):
    """One GPU of one worker at one heartbeat: utilisation and memory.

    At most one sample per worker per `retention.gpu_sample_interval_s`, kept
    `retention.gpu_samples_days` (the daily prune). A task's GPU use is the samples of
    its attempts' worker, GPU indices and time windows (`autoscaler.metrics.gpu_use`)."""

    __tablename__ = "gpu_samples"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    worker_id: Mapped[str] = mapped_column(String(32))
    at: Mapped[datetime] = mapped_column(index=True)
    gpu_index: Mapped[int] = mapped_column(Integer)
    utilization_pct: Mapped[float] = mapped_column(Float)
    memory_used_mb: Mapped[float] = mapped_column(Float)
    memory_total_mb: Mapped[float] = mapped_column(Float)

    __table_args__ = (Index("ix_gpu_samples_worker_at", "worker_id", "at"),)


class HistoryPoint(Base):
    """Sampled time series for charts: queue depth, fleet size, spend."""

    __tablename__ = "history"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(index=True)
    metric: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(128), default="")
    value: Mapped[float] = mapped_column(Float)


class TeamAdmissionRow(Base):
    """One team's admission, written after each policy evaluation and read by the
    lease (see `autoscaler.admission`). Team "" holds the default team's answer."""

    __tablename__ = "team_admission"
    team: Mapped[str] = mapped_column(String(64), primary_key=True)
    may_scale_up: Mapped[bool] = mapped_column(Boolean, default=True)
    drain: Mapped[bool] = mapped_column(Boolean, default=False)
    fail_safe: Mapped[bool] = mapped_column(Boolean, default=False)
    # USD/h of new spend left until the next evaluation; leases spend it. NULL: no limit.
    headroom_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    nominal_gpus: Mapped[int | None] = mapped_column(Integer)
    borrowing_limit_gpus: Mapped[int | None] = mapped_column(Integer)
    lending_limit_gpus: Mapped[int | None] = mapped_column(Integer)
    allowed_pools: Mapped[list[Any] | None] = mapped_column(JSON)
    allowed_capacity_types: Mapped[list[Any]] = mapped_column(default=list)
    priority_tier: Mapped[int] = mapped_column(Integer, default=0)
    priority_weight: Mapped[float] = mapped_column(Float, default=1.0)
    reasons: Mapped[list[Any]] = mapped_column(default=list)
    decided_at: Mapped[datetime]


class AlertEvent(Base):
    """One alert to deliver: a budget threshold crossed (per team, threshold, basis and
    budget period), a hard budget freezing or draining a team, a pool in launch backoff,
    a machine that never registered, the policy failing safe. `key` says what makes it
    the same alert, so a cycle that sees it again (or another leader) adds nothing."""

    __tablename__ = "alert_events"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    key: Mapped[str] = mapped_column(String(255), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    team: Mapped[str | None] = mapped_column(String(64))
    level: Mapped[str] = mapped_column(String(16))
    period: Mapped[str | None] = mapped_column(String(7))
    threshold_pct: Mapped[float | None] = mapped_column(Float)
    basis: Mapped[str | None] = mapped_column(String(16))
    message: Mapped[str] = mapped_column(Text)
    details: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(index=True)


class AlertDelivery(Base):
    """An alert's delivery to one channel: pending until sent, retried with backoff."""

    __tablename__ = "alert_deliveries"
    __table_args__ = (
        UniqueConstraint("event_id", "channel", name="uq_alert_deliveries_event_channel"),
        Index("ix_alert_deliveries_due", "status", "next_attempt_at"),
    )
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    event_id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), ForeignKey("alert_events.id", ondelete="CASCADE")
    )
    channel: Mapped[str] = mapped_column(String(64))
    # pending -> delivered, or failed once `retry.max_attempts` is spent.
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    # A sender holds the row until then (another process skips it); a crash frees it then.
    claimed_until: Mapped[datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]
    delivered_at: Mapped[datetime | None]


class AlertCondition(Base):
    """Since when an ongoing condition (a pool in backoff, the policy failing safe) holds;
    kept in the database so a restart neither forgets nor restarts its clock."""

    __tablename__ = "alert_conditions"
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    since: Mapped[datetime]
    last_seen: Mapped[datetime]


class Snapshot(Base):
    """A code snapshot (tar.gz) a team uploaded; content-addressed within the team, so
    one team cannot name (or learn of) another team's snapshot."""

    __tablename__ = "snapshots"
    team: Mapped[str] = mapped_column(String(64), primary_key=True)
    digest: Mapped[str] = mapped_column(String(80), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    key: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime]


class Artifact(Base):
    """A file a task's attempt left: an output or a checkpoint, stored under `key` in the
    artifact store. One row per (task, name, attempt, generation); a single task's
    periodic checkpoint replaces its attempt's row (generation 0). A gang's rows name
    their rank (`rank-R/...` and `rank`), and its checkpoints are kept per generation,
    the k-th checkpoint point of the attempt (docs/gangs.md, "Checkpoints")."""

    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(32), ForeignKey("tasks.id", ondelete="CASCADE"))
    team: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(1024))
    kind: Mapped[str] = mapped_column(String(16))
    attempt: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(BigInteger)
    digest: Mapped[str] = mapped_column(String(80))
    key: Mapped[str] = mapped_column(String(1200))
    created_at: Mapped[datetime]
    # A gang's rank that left it; None: a single-node task's.
    rank: Mapped[int | None] = mapped_column(Integer)
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    __table_args__ = (
        UniqueConstraint("task_id", "name", "attempt", "generation", name="uq_artifacts_task_name_attempt_generation"),
        Index("ix_artifacts_created_at", "created_at"),
    )
