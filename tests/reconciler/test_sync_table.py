"""The passive sync, as a table: every open row state x every provider observation.

`passive_sync` is pure (rows, observation, now, settings, memory in; transitions out),
so each case is one call, no database, no provider, no clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from autoscaler.reconciler.states import InstanceState
from autoscaler.reconciler.sync import (
    Adopt,
    BindWorker,
    Drain,
    Memory,
    Move,
    Observation,
    RecordProviderId,
    Row,
    Settings,
    SyncResult,
    Terminate,
    passive_sync,
)
from providers.base import InstanceStatus, InterruptionEvent, ProviderInstance

S = InstanceState
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
GRACE = timedelta(seconds=60)
SETTINGS = Settings(orphan_grace=GRACE)
POOL = "gpu"
LONG_AGO = NOW - timedelta(hours=1)

# What the pool's listing may say about the row's instance.
OBSERVATIONS = ("not_listed", "pending", "running", "stopping", "terminated", "preempted", "listing_failed")
STATUS = {
    "pending": InstanceStatus.PENDING,
    "running": InstanceStatus.RUNNING,
    "stopping": InstanceStatus.STOPPING,
    "terminated": InstanceStatus.TERMINATED,
    "preempted": InstanceStatus.PREEMPTED,
}
# Row kinds: (state, has a provider id).
ROWS = {
    "requested": (S.REQUESTED, False),
    "launching": (S.LAUNCHING, False),
    "booting": (S.BOOTING, True),
    "ready": (S.READY, True),
    "draining": (S.DRAINING, True),
    "terminating": (S.TERMINATING, True),
    "terminating_no_pid": (S.TERMINATING, False),
    "boot_timeout": (S.BOOT_TIMEOUT, True),
    "lost": (S.LOST, True),
    "preempted": (S.PREEMPTED, True),
}
# Expected outcome codes:
#   nothing     no change, nothing terminated, no memory
#   adopt       Adopt (-> booting), listed in `adopted`
#   clear       no change; any "missing since" is forgotten
#   missing     no change now, "missing since" remembered; `lost` after the grace period
#   preempt     Move -> preempted
#   terminated  Move -> terminated (the provider no longer lists it)
#   terminate   terminate the listed instance again, row unchanged
#   leak        record the listed instance's id on the row and terminate it
_LIVE_STATUSES = ("pending", "running", "stopping", "terminated", "preempted")
TABLE: dict[str, dict[str, str]] = {
    "requested": {"not_listed": "nothing", **dict.fromkeys(_LIVE_STATUSES, "adopt")},
    "launching": {"not_listed": "nothing", **dict.fromkeys(_LIVE_STATUSES, "adopt")},
    **{
        k: {
            "not_listed": "missing",
            "pending": "clear",
            "running": "clear",
            "stopping": "clear",
            "terminated": "missing",
            "preempted": "preempt",
        }
        for k in ("booting", "ready", "draining")
    },
    "terminating": {
        "not_listed": "terminated",
        "pending": "terminate",
        "running": "terminate",
        "stopping": "terminate",
        "terminated": "terminated",
        "preempted": "terminate",
    },
    "terminating_no_pid": {
        "not_listed": "terminated",
        "pending": "leak",
        "running": "leak",
        "stopping": "leak",
        "terminated": "terminated",
        "preempted": "leak",
    },
    **{k: dict.fromkeys(("not_listed", *_LIVE_STATUSES), "nothing") for k in ("boot_timeout", "lost", "preempted")},
}
for _row in TABLE.values():
    _row["listing_failed"] = "nothing"  # a pool whose listing failed: none of its rows is judged


def _row(kind: str, **kw: object) -> Row:
    state, has_pid = ROWS[kind]
    base: dict[str, object] = {
        "id": "row-1",
        "pool": POOL,
        "request_id": "req-1",
        "state": state,
        "provider_instance_id": "i-1" if has_pid else None,
        "launched_at": LONG_AGO if has_pid else None,
        "created_at": LONG_AGO,
    }
    base.update(kw)
    return Row(**base)  # type: ignore[arg-type]


def _listed(status: InstanceStatus, *, iid: str = "i-1", request_id: str | None = "req-1") -> ProviderInstance:
    return ProviderInstance(
        instance_id=iid,
        request_id=request_id,
        pool=POOL,
        instance_type="g.1",
        capacity_type="spot",
        zone="z1",
        status=status,
        launched_at=LONG_AGO,
    )


def _observe(what: str) -> Observation:
    if what == "listing_failed":
        return Observation(listings={})
    if what == "not_listed":
        return Observation(listings={POOL: []})
    return Observation(listings={POOL: [_listed(STATUS[what])]})


def _sync(rows: list[Row], obs: Observation, memory: Memory | None = None, now: datetime = NOW) -> SyncResult:
    return passive_sync(rows, obs, now, SETTINGS, memory or Memory())


def test_the_table_covers_every_state_and_observation() -> None:
    assert set(TABLE) == set(ROWS)
    open_states = {s for s in S if s not in (S.TERMINATED, S.LAUNCH_FAILED)}
    assert {state for state, _ in ROWS.values()} == open_states
    for kind, row in TABLE.items():
        assert set(row) == set(OBSERVATIONS), kind


CASES = [(kind, what, expected) for kind, row in TABLE.items() for what, expected in row.items()]


@pytest.mark.parametrize(("kind", "what", "expected"), CASES, ids=[f"{k}-{w}" for k, w, _ in CASES])
def test_row_state_by_observation(kind: str, what: str, expected: str) -> None:
    row = _row(kind)
    out = _sync([row], _observe(what))
    assert out.orphans == (), "a listed instance of an open row is never an orphan"
    if expected == "nothing":
        assert out.changes == () and out.terminate == ()
        assert out.memory.missing_since == {}
    elif expected == "adopt":
        assert out.changes == (Adopt("row-1", _listed(STATUS[what])),)
        assert out.adopted == ("row-1",) and out.terminate == ()
    elif expected == "clear":
        remembered = _sync([row], _observe(what), Memory(missing_since={"row-1": NOW - timedelta(seconds=5)}))
        assert remembered.changes == () and remembered.terminate == ()
        assert remembered.memory.missing_since == {}
    elif expected == "missing":
        assert out.changes == () and out.terminate == ()
        assert out.memory.missing_since == {"row-1": NOW}, "one listing is never enough"
        later = _sync([row], _observe(what), out.memory, now=NOW + GRACE)
        assert later.changes == (Move("row-1", S.LOST, "the provider no longer lists it"),)
        assert later.lost == ("row-1",) and later.memory.missing_since == {}
    elif expected == "preempt":
        assert out.changes == (Move("row-1", S.PREEMPTED, "the provider reclaimed the spot capacity"),)
        assert out.preempted == ("row-1",)
    elif expected == "terminated":
        assert out.changes == (Move("row-1", S.TERMINATED, "the provider no longer lists it"),)
        assert out.terminate == ()
    elif expected == "terminate":
        assert out.changes == ()
        assert out.terminate == (Terminate(POOL, "i-1", "terminating"),)
    elif expected == "leak":
        # The VM a crash at `after_terminate_intent` left behind: found by request id,
        # recorded on the row, terminated (it used to live forever).
        assert out.changes == (RecordProviderId("row-1", "i-1"),)
        assert out.terminate == (Terminate(POOL, "i-1", "terminating"),)
    else:  # pragma: no cover
        raise AssertionError(expected)


def test_a_recently_launched_instance_is_not_lost_even_when_missing_long() -> None:
    row = _row("booting", launched_at=NOW - timedelta(seconds=10))
    out = _sync([row], _observe("not_listed"), Memory(missing_since={"row-1": NOW - GRACE}))
    assert out.changes == () and out.memory.missing_since == {"row-1": NOW - GRACE}


def test_the_leak_then_confirmed_gone() -> None:
    """Two cycles: record + terminate, then (the row has its id now) not listed -> terminated."""
    row = _row("terminating_no_pid")
    first = _sync([row], _observe("running"))
    assert first.terminate == (Terminate(POOL, "i-1", "terminating"),)
    after = _sync([_row("terminating_no_pid", provider_instance_id="i-1")], _observe("not_listed"))
    assert after.changes == (Move("row-1", S.TERMINATED, "the provider no longer lists it"),)


def test_rows_match_by_provider_id_when_they_have_one() -> None:
    # A row with a provider id is not matched by request id: another instance carrying
    # its request id (impossible by idempotency, but say so) does not count as it.
    row = _row("ready")
    obs = Observation(listings={POOL: [_listed(InstanceStatus.RUNNING, iid="i-other")]})
    out = _sync([row], obs)
    assert out.memory.missing_since == {"row-1": NOW}
    assert out.orphans == (), "carrying an open row's request id: not an orphan"


def test_orphan_needs_the_grace_period_since_first_seen_and_since_launch() -> None:
    stranger = _listed(InstanceStatus.RUNNING, iid="i-9", request_id="req-unknown")
    obs = Observation(listings={POOL: [stranger]})
    first = _sync([], obs)
    # Launched an hour ago, but seen only now: one listing is never enough.
    assert first.orphans == () and first.terminate == () and first.memory.orphan_seen == {"i-9": NOW}
    almost = _sync([], obs, first.memory, now=NOW + GRACE - timedelta(seconds=1))
    assert almost.orphans == ()
    later = _sync([], obs, almost.memory, now=NOW + GRACE)
    assert later.orphans == ("i-9",) and later.terminate == (Terminate(POOL, "i-9", "orphan"),)
    assert later.memory.orphan_seen == {}


def test_young_orphan_waits_for_its_launch_age_too() -> None:
    young = ProviderInstance("i-8", "req-x", POOL, "g.1", "spot", "z1", InstanceStatus.RUNNING, launched_at=NOW)
    obs = Observation(listings={POOL: [young]})
    out = _sync([], obs, Memory(orphan_seen={"i-8": NOW - GRACE}))
    assert out.orphans == ()
    assert _sync([], obs, Memory(orphan_seen={"i-8": NOW - GRACE}), now=NOW + GRACE).orphans == ("i-8",)


@pytest.mark.parametrize("status", [InstanceStatus.STOPPING, InstanceStatus.TERMINATED])
def test_going_instances_are_not_orphans(status: InstanceStatus) -> None:
    obs = Observation(listings={POOL: [_listed(status, iid="i-7", request_id=None)]})
    out = _sync([], obs, Memory(orphan_seen={"i-7": NOW - 2 * GRACE}), now=NOW + GRACE)
    assert out.orphans == ()


def test_an_orphan_that_gains_a_row_is_forgotten() -> None:
    obs = Observation(listings={POOL: [_listed(InstanceStatus.RUNNING)]})
    out = _sync([_row("launching")], obs, Memory(orphan_seen={"i-1": NOW - GRACE}))
    assert out.adopted == ("row-1",) and out.memory.orphan_seen == {}


def test_booting_row_with_a_registered_agent_becomes_ready() -> None:
    obs = Observation(listings={POOL: [_listed(InstanceStatus.RUNNING)]}, workers={(POOL, "i-1"): "w-1"})
    out = _sync([_row("booting")], obs)
    assert out.changes == (BindWorker("row-1", "w-1"), Move("row-1", S.READY, "agent registered as worker w-1"))


def test_adopted_row_with_a_registered_agent_becomes_ready_in_the_same_sync() -> None:
    obs = Observation(listings={POOL: [_listed(InstanceStatus.RUNNING)]}, workers={(POOL, "i-1"): "w-1"})
    out = _sync([_row("launching")], obs)
    assert [type(c) for c in out.changes] == [Adopt, BindWorker, Move]
    assert out.changes[-1] == Move("row-1", S.READY, "agent registered as worker w-1")


def test_registration_is_applied_even_when_the_listing_failed() -> None:
    obs = Observation(listings={}, workers={(POOL, "i-1"): "w-1"})
    out = _sync([_row("booting")], obs)
    assert out.changes[-1] == Move("row-1", S.READY, "agent registered as worker w-1")


@pytest.mark.parametrize(
    ("kind", "drained"),
    [
        ("ready", True),
        ("draining", True),
        ("booting", True),  # its agent registered: ready in this sync, then drained
        ("booting-no-agent", False),
        ("terminating", False),
        ("lost", False),
    ],
)
def test_interruption_notice_drains_ready_and_draining_rows(kind: str, drained: bool) -> None:
    ev = InterruptionEvent("i-1", "interruption", NOW, deadline=NOW + timedelta(seconds=120))
    obs = Observation(listings={POOL: [_listed(InstanceStatus.RUNNING)]}, interruptions=((POOL, ev),))
    worker = None if kind.endswith("no-agent") else "w-1"
    out = _sync([_row(kind.removesuffix("-no-agent"), worker_id=worker)], obs)
    drains = [c for c in out.changes if isinstance(c, Drain)]
    assert drains == ([Drain("row-1", "w-1", 120.0, "interruption")] if drained else [])


def test_interruption_for_another_pool_or_instance_is_ignored() -> None:
    ev = InterruptionEvent("i-1", "rebalance", NOW)
    obs = Observation(
        listings={}, interruptions=(("other-pool", ev), (POOL, InterruptionEvent("i-2", "rebalance", NOW)))
    )
    assert _sync([_row("ready", worker_id="w-1")], obs).changes == ()


def test_past_deadline_drains_now() -> None:
    ev = InterruptionEvent("i-1", "interruption", NOW, deadline=NOW - timedelta(seconds=5))
    obs = Observation(listings={}, interruptions=((POOL, ev),))
    assert _sync([_row("ready", worker_id="w-1")], obs).changes == (Drain("row-1", "w-1", 0.0, "interruption"),)


def test_static_pool_reports_machines_without_agent_and_judges_nothing() -> None:
    machines = [_listed(InstanceStatus.RUNNING, iid=f"m{n}", request_id=None) for n in (1, 2)]
    obs = Observation(listings={POOL: machines}, static_pools=frozenset({POOL}), workers={(POOL, "m1"): "w-1"})
    out = _sync([], obs, Memory(orphan_seen={"m2": NOW - 2 * GRACE}), now=NOW + GRACE)
    assert out.static_without_agent == {POOL: frozenset({"m2"})}
    assert out.orphans == () and out.terminate == () and out.changes == ()


def test_pure_inputs_are_not_mutated() -> None:
    memory = Memory(missing_since={"x": NOW}, orphan_seen={"y": NOW})
    _sync([_row("ready")], _observe("not_listed"), memory)
    assert memory.missing_since == {"x": NOW} and memory.orphan_seen == {"y": NOW}
