"""The lease gate against the reviewer's probes, through the real `lease()` on SQLite
and PostgreSQL: a frozen team leases nothing on capacity it does not pay for, a
quota caps what a team holds, a task never lands on a machine too small for it, and
no number of older tasks that do not fit hides one that does."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from autoscaler.clock import ManualClock
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.queueing import tasks as ops
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, Task, Worker
from tests.queueing.helpers import add_task, add_worker, decide, get_task, lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def machine(
    sessions,
    clock: ManualClock,
    *,
    team: str | None,
    gpus: int = 1,
    price: float = 1.0,
    cpus: int = 0,
    memory_mb: int = 0,
    capacity_type: str = "spot",
    tenancy: str = "team",
) -> str:
    """A worker on an instance our reconciler launched for `team`'s demand."""
    worker_id = add_worker(sessions, clock, gpus=gpus, tenancy=tenancy)
    with transaction(sessions) as s:
        w = s.get(Worker, worker_id)
        assert w is not None
        w.cpus, w.memory_mb = cpus, memory_mb
        now: datetime = clock.now()
        s.add(
            Instance(
                request_id=f"r-{worker_id}",
                provider="fake",
                pool=w.pool,
                instance_type="g.x",
                capacity_type=capacity_type,
                gpus=gpus,
                gpu_type="A10G",
                provider_instance_id=w.instance_id,
                state="ready",
                team=team,
                hourly_price=price,
                worker_id=worker_id,
                created_at=now,
                updated_at=now,
                launched_at=now,
            )
        )
    return worker_id


def frozen(**extra: object) -> TeamDecision:
    return TeamDecision(may_scale_up=False, spend_headroom_per_hour=0.0, reasons=["budget: hard budget spent"], **extra)  # type: ignore[arg-type]


def test_frozen_team_leases_nothing_on_another_teams_machine(setup, clock) -> None:
    s = setup.sessions
    other = machine(s, clock, team="nlp", gpus=2, price=2.0, tenancy="shared")
    held = add_task(s, clock, team="vision", gpus=1)
    two = add_task(s, clock, team="vision", gpus=2)
    decide(s, clock, Decision(teams={"vision": frozen(), "nlp": TeamDecision()}))
    assert lease(s, clock, other) is None
    assert get_task(s, held).state == "queued" and get_task(s, two).state == "queued"
    # The other team's own work still runs there.
    mine = add_task(s, clock, team="nlp", gpus=1)
    got = lease(s, clock, other)
    assert got is not None and got.id == mine


def test_frozen_team_may_use_what_it_already_pays_for(setup, clock) -> None:
    s = setup.sessions
    own = machine(s, clock, team="vision", gpus=2)
    t = add_task(s, clock, team="vision")
    decide(s, clock, Decision(teams={"vision": frozen()}))
    got = lease(s, clock, own)
    assert got is not None and got.id == t


def test_drained_team_gets_nothing_even_on_its_own_machine(setup, clock) -> None:
    s = setup.sessions
    own = machine(s, clock, team="vision", gpus=2)
    add_task(s, clock, team="vision")
    decide(s, clock, Decision(teams={"vision": frozen(drain=True)}))
    assert lease(s, clock, own) is None


def test_shared_capacity_needs_headroom(setup, clock) -> None:
    """A pool-minimum machine is charged to the shared line: a lease moves its cost
    onto the team, so it needs the team's headroom, and spends it."""
    s = setup.sessions
    shared = machine(s, clock, team=None, gpus=4, price=4.0, tenancy="shared")
    tasks = []
    for _ in range(4):
        tasks.append(add_task(s, clock, team="vision"))
        clock.advance(1)
    decide(s, clock, Decision(teams={"vision": TeamDecision(spend_headroom_per_hour=2.5)}))
    got = [lease(s, clock, shared) for _ in range(4)]
    assert [t.id if t else None for t in got] == [tasks[0], tasks[1], None, None]


@pytest.mark.parametrize("launched_for", [None, "shared"])
def test_a_no_team_machine_on_a_team_pool_admits_by_the_lease_gate_one_team_at_a_time(
    setup, clock, launched_for: str | None
) -> None:
    """A machine launched for no team (a pool minimum, a shared standby: the reconciler
    records its launch team as "shared") under `tenancy: team`: any team may take it,
    but only through its own admission (a frozen team gets nothing; headroom caps
    what a team takes), and once a team holds it no other team's work joins."""
    s = setup.sessions
    spare = machine(s, clock, team=launched_for, gpus=4, price=4.0, tenancy="team")
    held = add_task(s, clock, team="ops")
    clock.advance(1)
    tasks = []
    for _ in range(3):
        tasks.append(add_task(s, clock, team="vision"))
        clock.advance(1)
    nlp = add_task(s, clock, team="nlp")
    decide(
        s,
        clock,
        Decision(teams={"ops": frozen(), "vision": TeamDecision(spend_headroom_per_hour=2.5), "nlp": TeamDecision()}),
    )
    got = [lease(s, clock, spare) for _ in range(4)]
    assert [t.id if t else None for t in got] == [tasks[0], tasks[1], None, None]
    assert get_task(s, held).state == "queued" and get_task(s, nlp).state == "queued"


def test_quota_caps_leases(setup, clock) -> None:
    s = setup.sessions
    workers = [machine(s, clock, team="research", gpus=1) for _ in range(20)]
    for _ in range(60):
        add_task(s, clock, team="research")
    decide(s, clock, Decision(teams={"research": TeamDecision(nominal_gpus=16, borrowing_limit_gpus=0)}))
    leased = [lease(s, clock, w) for w in workers]
    assert sum(1 for t in leased if t is not None) == 16
    with setup.sessions() as db:
        held = db.scalars(select(Task).where(Task.team == "research", Task.state == "leased")).all()
    assert sum(t.gpus for t in held) == 16


def test_borrowing_only_what_others_leave_unused_and_reclaim(setup, clock) -> None:
    s = setup.sessions
    workers = [machine(s, clock, team=None, gpus=1, price=0.0, tenancy="shared") for _ in range(12)]
    quotas = Decision(
        teams={
            "research": TeamDecision(nominal_gpus=4, borrowing_limit_gpus=4),
            "prod": TeamDecision(nominal_gpus=4),
        }
    )
    for _ in range(10):
        add_task(s, clock, team="research")
        clock.advance(1)
    decide(s, clock, quotas)
    got = [lease(s, clock, w) for w in workers[:10]]
    # Nominal 4 plus the 4 prod leaves unused.
    assert sum(1 for t in got if t) == 8
    # prod takes its quota back: two of research's borrowed tasks are asked to stop.
    for _ in range(2):
        add_task(s, clock, team="prod")
    assert lease(s, clock, workers[10]) is not None
    assert lease(s, clock, workers[11]) is not None
    with setup.sessions() as db:
        reclaimed = db.scalars(select(Task).where(Task.reclaim_requested.is_(True))).all()
    assert len(reclaimed) == 2 and {t.team for t in reclaimed} == {"research"}


def test_task_too_big_for_the_machine_is_never_leased(setup, clock) -> None:
    s = setup.sessions
    small = machine(s, clock, team="vision", gpus=1, cpus=1, memory_mb=2000)
    big = add_task(s, clock, cpus=64, memory_mb=500000)
    add_task(s, clock, cpus=2)
    fits = add_task(s, clock, cpus=1, memory_mb=1500)
    got = lease(s, clock, small)
    assert got is not None and got.id == fits
    assert get_task(s, big).state == "queued"


def test_free_cpus_and_memory_are_what_running_tasks_leave(setup, clock) -> None:
    s = setup.sessions
    w = machine(s, clock, team="vision", gpus=4, cpus=8, memory_mb=32000)
    a = add_task(s, clock, cpus=6, memory_mb=1000)
    clock.advance(1)
    b = add_task(s, clock, cpus=4)
    clock.advance(1)
    c = add_task(s, clock, cpus=2, memory_mb=31000)
    assert lease(s, clock, w).id == a  # type: ignore[union-attr]
    got = lease(s, clock, w)  # b needs 4 CPUs, only 2 left; c fits
    assert got is not None and got.id == c
    assert get_task(s, b).state == "queued"


def test_no_head_of_line_blocking(setup, clock) -> None:
    s = setup.sessions
    for _ in range(40):
        add_task(s, clock, gpu_type="H100")
        clock.advance(1)
    fits = add_task(s, clock, gpu_type="A10G")
    w = machine(s, clock, team="vision")
    got = lease(s, clock, w)
    assert got is not None and got.id == fits


@pytest.mark.parametrize(
    ("wanted", "ok"),
    [("A10G", True), ("a10g", True), ("NVIDIA A10G", True), ("A10", False), ("H100", False)],
)
def test_gpu_type_is_matched_by_words(setup, clock, wanted: str, ok: bool) -> None:
    s = setup.sessions
    t = add_task(s, clock, gpu_type=wanted)
    w = machine(s, clock, team="vision")
    got = lease(s, clock, w)
    assert (got is not None and got.id == t) is ok


def test_policy_weights_order_leases(setup, clock) -> None:
    s = setup.sessions
    w = machine(s, clock, team=None, gpus=8, price=0.0, tenancy="shared")
    for team in ("a", "b"):
        add_task(s, clock, team=team)
        assert lease(s, clock, w) is not None
    clock.advance(1)
    a_next = add_task(s, clock, team="a")
    clock.advance(1)
    b_next = add_task(s, clock, team="b")
    decide(s, clock, Decision(teams={"a": TeamDecision(priority_weight=4.0), "b": TeamDecision()}))
    assert lease(s, clock, w).id == a_next  # type: ignore[union-attr]
    assert lease(s, clock, w).id == b_next  # type: ignore[union-attr]


def test_pool_and_capacity_type_restrictions_hold_at_lease(setup, clock) -> None:
    s = setup.sessions
    spot = machine(s, clock, team="vision", capacity_type="spot")
    t = add_task(s, clock, team="vision")
    decide(s, clock, Decision(teams={"vision": TeamDecision(allowed_capacity_types=["on_demand"])}))
    assert lease(s, clock, spot) is None
    decide(s, clock, Decision(teams={"vision": TeamDecision(allowed_pools=["cpu-pool"])}))
    assert lease(s, clock, spot) is None
    decide(s, clock, Decision(teams={"vision": TeamDecision()}))
    assert lease(s, clock, spot).id == t  # type: ignore[union-attr]


def test_reclaimed_task_is_told_to_stop_and_requeued_without_spending_attempts(setup, clock) -> None:
    from autoscaler.queueing import workers as wops

    s = setup.sessions
    w = machine(s, clock, team=None, gpus=1, price=0.0)
    t = add_task(s, clock, team="research", max_attempts=1)
    assert lease(s, clock, w) is not None
    with transaction(s) as db:
        task = db.get(Task, t)
        assert task is not None
        task.reclaim_requested = True
        reply = wops.heartbeat(db, w, now=clock.now(), running=[t])
    assert reply.reclaim == [t]
    with transaction(s) as db:
        ops.finish(db, w, t, now=clock.now(), reason="interrupted", detail="reclaim")
    task = get_task(s, t)
    assert task.state == "queued" and task.end_reason == "interrupted:reclaim"
