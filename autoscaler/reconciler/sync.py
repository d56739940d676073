"""Passive sync as a pure function: `(rows, observation, now, settings) -> transitions`.

The cycle first gathers everything the providers say (listings, interruption notices)
with no transaction open, then reads the open instance rows and the live workers, calls
`passive_sync`, and applies what it returns in one short transaction. Nothing here
touches a database, a provider or a clock: every case is a table test
(`tests/reconciler/test_sync_table.py`).

Per row (state x what the pool's listing shows; a pool whose listing failed is not in
the observation, so none of its rows is judged):

| row state | listed running/pending/stopping | listed preempted | listed terminated, or not listed |
|---|---|---|---|
| requested, launching | adopt (`booting`) | adopt (`booting`; next sync sees the reclaim) | nothing (the launch may be in flight, or is resumed with the same request id) |
| booting, ready, draining | clear "missing since" | `preempted` | `lost` once missing for the grace period and launched longer ago than it |
| terminating, with a provider id | terminate again | terminate again | `terminated` |
| terminating, no provider id, found by request id | record the provider id and terminate it (the VM a crash left behind) | same | `terminated` |
| boot_timeout, lost, preempted | nothing (the planner terminates them) | nothing | nothing |

A row is matched by its provider id when it has one, else by its request id. An
instance carrying our owner tag in this pool that matches no open row is an orphan:
terminated once it was launched *and* first seen at least the grace period ago (one
listing is never enough: listings are eventually consistent). Booting rows whose agent
registered become `ready`; interruption notices drain the worker of a ready or
draining row. Static pools only report declared machines with no agent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from autoscaler.reconciler.states import InstanceState
from providers.base import InstanceStatus, InterruptionEvent, ProviderInstance

S = InstanceState
GONE = (InstanceStatus.TERMINATED,)


@dataclass(frozen=True)
class Row:
    """What the sync needs of one open `Instance` row."""

    id: str
    pool: str
    request_id: str
    state: InstanceState
    provider_instance_id: str | None = None
    worker_id: str | None = None
    launched_at: datetime | None = None
    created_at: datetime | None = None
    # One of the machines of a gang launch: the request id the provider tagged them all
    # with (the rows of one launch share it; each takes a distinct listed instance).
    launch_request_id: str | None = None

    @property
    def provider_request_id(self) -> str:
        return self.launch_request_id or self.request_id


@dataclass(frozen=True)
class Observation:
    """What the providers (and the agents' registrations) said, gathered before any
    transaction opened."""

    # Pools whose listing succeeded (a failed one is absent: nothing of it is judged).
    listings: Mapping[str, Sequence[ProviderInstance]]
    # Pools whose provider is static (declared on-prem machines: never inventory).
    static_pools: frozenset[str] = frozenset()
    # (pool, event) for every provider interruption notice read this cycle.
    interruptions: Sequence[tuple[str, InterruptionEvent]] = ()
    # (pool, provider instance id) -> worker id, for live workers (idle, busy, draining).
    workers: Mapping[tuple[str, str], str] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    orphan_grace: timedelta


@dataclass(frozen=True)
class Memory:
    """Times the leader keeps between cycles (lost on failover: grace restarts, later
    never earlier)."""

    # Row id -> when its instance first went missing from the listing.
    missing_since: Mapping[str, datetime] = field(default_factory=dict)
    # Provider instance id -> when an instance with no open row was first listed.
    orphan_seen: Mapping[str, datetime] = field(default_factory=dict)


# ---- the transitions --------------------------------------------------------------


@dataclass(frozen=True)
class Adopt:
    """An intent's request id shows up in the listing: record the instance, `booting`."""

    row_id: str
    instance: ProviderInstance
    reason: str = "adopted: the provider lists an instance with this launch's request id"


@dataclass(frozen=True)
class Move:
    row_id: str
    to: InstanceState
    reason: str


@dataclass(frozen=True)
class RecordProviderId:
    """A `terminating` row with no provider id whose VM did launch: remember its id."""

    row_id: str
    provider_instance_id: str


@dataclass(frozen=True)
class BindWorker:
    row_id: str
    worker_id: str


@dataclass(frozen=True)
class Drain:
    """A provider notice: drain the worker at once (deadline = the notice's), then the row."""

    row_id: str
    worker_id: str
    deadline_s: float
    kind: str
    detail: str = ""  # the provider's words, for the instance's history


Change = Adopt | Move | RecordProviderId | BindWorker | Drain


@dataclass(frozen=True)
class Terminate:
    pool: str
    provider_instance_id: str
    why: str  # "orphan" | "terminating"


@dataclass(frozen=True)
class SyncResult:
    changes: tuple[Change, ...]
    terminate: tuple[Terminate, ...]
    memory: Memory
    adopted: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()
    lost: tuple[str, ...] = ()
    orphans: tuple[str, ...] = ()
    # pool -> declared static machines with no live agent.
    static_without_agent: Mapping[str, frozenset[str]] = field(default_factory=dict)


@dataclass
class _Cur:
    """A row as the changes so far left it."""

    state: InstanceState
    pid: str | None
    worker_id: str | None


def passive_sync(
    rows: Sequence[Row], obs: Observation, now: datetime, settings: Settings, memory: Memory
) -> SyncResult:
    grace = settings.orphan_grace
    missing = dict(memory.missing_since)
    seen_at = dict(memory.orphan_seen)
    changes: list[Change] = []
    terminate: list[Terminate] = []
    adopted: list[str] = []
    preempted: list[str] = []
    lost: list[str] = []
    orphans: list[str] = []
    static: dict[str, frozenset[str]] = {}
    cur = {r.id: _Cur(r.state, r.provider_instance_id, r.worker_id) for r in rows}
    by_pool: dict[str, list[Row]] = {}
    for r in rows:
        by_pool.setdefault(r.pool, []).append(r)

    for pool, listed in obs.listings.items():
        if pool in obs.static_pools:
            static[pool] = frozenset(pi.instance_id for pi in listed if (pool, pi.instance_id) not in obs.workers)
            continue
        by_id = {pi.instance_id: pi for pi in listed}
        by_request: dict[str, list[ProviderInstance]] = {}
        for listed_pi in sorted(listed, key=lambda p: p.instance_id):
            if listed_pi.request_id:
                by_request.setdefault(listed_pi.request_id, []).append(listed_pi)
        pool_rows = by_pool.get(pool, [])
        # Instances some row of this pool already holds: a gang's rows share one request
        # id, so each row without an instance takes one no other row holds.
        taken = {r.provider_instance_id for r in pool_rows if r.provider_instance_id}
        for row in pool_rows:
            c = cur[row.id]
            pi: ProviderInstance | None
            if row.provider_instance_id:
                pi = by_id.get(row.provider_instance_id)
            else:
                free = [p for p in by_request.get(row.provider_request_id, ()) if p.instance_id not in taken]
                pi = free[0] if free else None
                if pi is not None and row.state in (S.REQUESTED, S.LAUNCHING, S.TERMINATING):
                    taken.add(pi.instance_id)
            state = row.state
            if state in (S.REQUESTED, S.LAUNCHING):
                if pi is not None:
                    changes.append(Adopt(row.id, pi))
                    c.state, c.pid = S.BOOTING, pi.instance_id
                    adopted.append(row.id)
                continue
            if state == S.TERMINATING:
                if pi is None or pi.status in GONE:
                    changes.append(Move(row.id, S.TERMINATED, "the provider no longer lists it"))
                    c.state = S.TERMINATED
                else:
                    if row.provider_instance_id is None:
                        # The leak: a crash after the terminate intent, before the launch
                        # was recorded. The VM is ours; record it and terminate it.
                        changes.append(RecordProviderId(row.id, pi.instance_id))
                        c.pid = pi.instance_id
                    terminate.append(Terminate(pool, pi.instance_id, "terminating"))
                continue
            if state not in (S.BOOTING, S.READY, S.DRAINING):
                continue
            if pi is not None and pi.status == InstanceStatus.PREEMPTED:
                changes.append(Move(row.id, S.PREEMPTED, "the provider reclaimed the spot capacity"))
                c.state = S.PREEMPTED
                preempted.append(row.id)
            elif pi is None or pi.status in GONE:
                first = missing.setdefault(row.id, now)
                launched = row.launched_at or row.created_at or now
                if now - first >= grace and now - launched >= grace:
                    changes.append(Move(row.id, S.LOST, "the provider no longer lists it"))
                    c.state = S.LOST
                    lost.append(row.id)
                    missing.pop(row.id, None)
            else:
                missing.pop(row.id, None)
        # Orphans: tagged with our owner, in this pool, and no open row.
        # A single launch's request id is known while its row is open; a gang launch's
        # instances are known only once a row holds them (one more than its rows is not ours).
        known = {r.request_id for r in pool_rows if r.launch_request_id is None}
        known_ids = {cur[r.id].pid for r in pool_rows if cur[r.id].pid} | taken
        for pi in listed:
            if pi.instance_id in known_ids or (pi.request_id and pi.request_id in known):
                seen_at.pop(pi.instance_id, None)
                continue
            if pi.status in (InstanceStatus.TERMINATED, InstanceStatus.STOPPING):
                continue
            seen = seen_at.setdefault(pi.instance_id, now)
            born = pi.launched_at or seen
            if now - born >= grace and now - seen >= grace:
                terminate.append(Terminate(pool, pi.instance_id, "orphan"))
                orphans.append(pi.instance_id)
                seen_at.pop(pi.instance_id, None)

    # Booting (or just adopted) rows whose agent registered become ready.
    for row in rows:
        c = cur[row.id]
        if c.worker_id is None and c.pid and c.state in (S.REQUESTED, S.LAUNCHING, S.BOOTING):
            wid = obs.workers.get((row.pool, c.pid))
            if wid is not None:
                changes.append(BindWorker(row.id, wid))
                c.worker_id = wid
    for row in rows:
        c = cur[row.id]
        if c.state == S.BOOTING and c.worker_id:
            changes.append(Move(row.id, S.READY, f"agent registered as worker {c.worker_id}"))
            c.state = S.READY

    # Provider notices (spot reclaim in ~2 min): drain at once, whatever the worker does.
    by_pid = {(r.pool, cur[r.id].pid): r for r in rows if cur[r.id].pid}
    for pool, ev in obs.interruptions:
        hit = by_pid.get((pool, ev.instance_id))
        if hit is None:
            continue
        c = cur[hit.id]
        if c.worker_id is None or c.state not in (S.READY, S.DRAINING):
            continue
        deadline = max(((ev.deadline or now) - now).total_seconds(), 0.0)
        changes.append(Drain(hit.id, c.worker_id, deadline, ev.kind, ev.detail))
        c.state = S.DRAINING

    return SyncResult(
        changes=tuple(changes),
        terminate=tuple(terminate),
        memory=Memory(missing, seen_at),
        adopted=tuple(adopted),
        preempted=tuple(preempted),
        lost=tuple(lost),
        orphans=tuple(orphans),
        static_without_agent=static,
    )
