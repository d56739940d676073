"""Queue semantics through the real service functions, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from autoscaler.errors import Conflict
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.queueing import tasks as ops
from autoscaler.queueing import workers as wops
from autoscaler.queueing.states import TRANSITIONS, TaskState
from autoscaler.state.db import transaction
from autoscaler.state.models import TaskEvent
from tests.queueing.helpers import add_task, add_worker, decide, get_task, get_worker, lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def test_lease_orders_by_queue_priority_then_task_priority_then_age(setup, clock) -> None:
    s = setup.sessions
    low_queue = add_task(s, clock, queue="vision-only", priority=100)
    clock.advance(1)
    old = add_task(s, clock, queue="gpu")
    clock.advance(1)
    urgent = add_task(s, clock, queue="gpu", priority=5)
    clock.advance(1)
    young = add_task(s, clock, queue="gpu")
    w = add_worker(s, clock, gpus=4)
    order = [lease(s, clock, w).id for _ in range(4)]  # type: ignore[union-attr]
    assert order == [urgent, old, young, low_queue]


def test_fair_share_prefers_the_team_holding_fewer_gpus(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock, gpus=4)
    first = add_task(s, clock, team="vision")
    clock.advance(1)
    vision_second = add_task(s, clock, team="vision")
    clock.advance(1)
    nlp_first = add_task(s, clock, team="nlp")
    assert lease(s, clock, w).id == first  # type: ignore[union-attr]
    # vision now holds a GPU, so nlp's younger task goes before vision's older one.
    assert lease(s, clock, w).id == nlp_first  # type: ignore[union-attr]
    assert lease(s, clock, w).id == vision_second  # type: ignore[union-attr]


def test_fair_share_uses_weights(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock, gpus=4, tenancy="shared")
    for team in ("vision", "nlp"):
        add_task(s, clock, team=team)
        assert lease(s, clock, w) is not None
    clock.advance(1)
    vision_next = add_task(s, clock, team="vision")
    clock.advance(1)
    nlp_next = add_task(s, clock, team="nlp")
    # Both hold one GPU. Unweighted, age decides (vision); with vision weighing 4,
    # its share is 1/4 against nlp's 1/1, so vision goes first; with nlp weighing 4,
    # nlp's younger task overtakes.
    decide(
        s,
        clock,
        Decision(teams={"vision": TeamDecision(priority_weight=1.0), "nlp": TeamDecision(priority_weight=4.0)}),
    )
    got = lease(s, clock, w)
    assert got is not None and got.id == nlp_next
    assert lease(s, clock, w).id == vision_next  # type: ignore[union-attr]


def test_gpu_fit_and_type(setup, clock) -> None:
    s = setup.sessions
    big = add_task(s, clock, gpus=2)
    a100 = add_task(s, clock, gpus=1, gpu_type="A100")
    fits = add_task(s, clock, gpus=1, gpu_type="a10g")
    w = add_worker(s, clock, gpus=1, model="NVIDIA A10G")
    got = lease(s, clock, w)
    assert got is not None and got.id == fits and got.gpu_indices == [0]
    assert lease(s, clock, w) is None  # no free GPU left
    assert get_task(s, big).state == "queued"
    assert get_task(s, a100).state == "queued"


def test_multi_gpu_worker_gets_distinct_indices(setup, clock) -> None:
    s = setup.sessions
    ids = [add_task(s, clock) for _ in range(4)]
    w = add_worker(s, clock, gpus=4)
    leased = [lease(s, clock, w) for _ in ids]
    assert sorted(i for t in leased for i in t.gpu_indices) == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert get_worker(s, w).state == "busy"


def test_draining_worker_gets_nothing_and_idle_only_drain_is_refused_when_busy(setup, clock) -> None:
    s = setup.sessions
    add_task(s, clock)
    add_task(s, clock)
    w = add_worker(s, clock, gpus=2)
    assert lease(s, clock, w) is not None
    with transaction(s) as sess, pytest.raises(Conflict):
        wops.drain(sess, w, now=clock.now(), deadline_s=60, reason="idle", only_if_idle=True)
    with transaction(s) as sess:
        wops.drain(sess, w, now=clock.now(), deadline_s=60, reason="admin")
    assert lease(s, clock, w) is None


def test_finish_paths_and_history(setup, clock) -> None:
    s = setup.sessions
    ok, bad = add_task(s, clock), add_task(s, clock, max_attempts=1)
    w = add_worker(s, clock, gpus=2)
    for _ in range(2):
        t = lease(s, clock, w)
        with transaction(s) as sess:
            ops.mark_started(sess, w, t.id, now=clock.now())  # type: ignore[union-attr]
    with transaction(s) as sess:
        ops.finish(sess, w, ok, now=clock.now(), reason="exit", exit_code=0)
        ops.finish(sess, w, bad, now=clock.now(), reason="exit", exit_code=3)
        # A retried report is harmless.
        ops.finish(sess, w, bad, now=clock.now(), reason="exit", exit_code=3)
    assert get_task(s, ok).state == "succeeded"
    failed = get_task(s, bad)
    assert (failed.state, failed.exit_code, failed.end_reason, failed.failures) == ("failed", 3, "exit_code", 1)
    assert get_worker(s, w).state == "idle"
    with s() as sess:
        reasons = [
            e.to_state for e in sess.scalars(select(TaskEvent).where(TaskEvent.task_id == ok).order_by(TaskEvent.id))
        ]
    assert reasons == ["queued", "leased", "running", "succeeded"]


def test_interrupted_task_is_requeued_at_head_and_spot_reclaims_do_not_spend_attempts(setup, clock) -> None:
    s = setup.sessions
    first = add_task(s, clock, max_attempts=2)
    clock.advance(5)
    add_task(s, clock)
    w = add_worker(s, clock)
    # Three reclaims of a task allowed two attempts: each goes back to the head of the
    # queue, because a reclaim is not the task's failure.
    for attempt in (1, 2, 3):
        t = lease(s, clock, w)
        assert t is not None and t.id == first and t.attempts == attempt
        with transaction(s) as sess:
            ops.finish(sess, w, first, now=clock.now(), reason="interrupted", detail="spot")
    task = get_task(s, first)
    assert (task.state, task.end_reason, task.interruptions) == ("queued", "interrupted:spot", 3)


def test_lost_attempts_do_not_count_against_max_attempts(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=2)
    for _ in (1, 2, 3):
        w = add_worker(s, clock)
        assert lease(s, clock, w) is not None
        clock.advance(61)
        with transaction(s) as sess:
            wops.expire_silent_workers(sess, now=clock.now(), timeout_s=60)
    task = get_task(s, tid)
    assert (task.state, task.end_reason, task.interruptions, task.failures) == ("queued", "lost:heartbeat", 3, 0)


def test_a_task_reclaimed_without_end_fails_after_max_interruptions(setup, clock, monkeypatch) -> None:
    monkeypatch.setattr(ops, "MAX_INTERRUPTIONS", 3)
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=1)
    w = add_worker(s, clock)
    for _ in range(ops.MAX_INTERRUPTIONS + 1):
        assert lease(s, clock, w) is not None
        with transaction(s) as sess:
            ops.finish(sess, w, tid, now=clock.now(), reason="interrupted", detail="spot")
    task = get_task(s, tid)
    assert task.state == "failed" and task.interruptions == ops.MAX_INTERRUPTIONS + 1


def test_cancel_queued_and_running(setup, clock) -> None:
    s = setup.sessions
    in_flight = add_task(s, clock)
    clock.advance(1)
    waiting = add_task(s, clock)
    w = add_worker(s, clock)
    t = lease(s, clock, w)
    assert t is not None and t.id == in_flight
    with transaction(s) as sess:
        ops.cancel(sess, sess.get(ops.Task, waiting), now=clock.now())  # type: ignore[arg-type]
        ops.cancel(sess, sess.get(ops.Task, in_flight), now=clock.now())  # type: ignore[arg-type]
    assert get_task(s, waiting).state == "canceled"
    assert get_task(s, in_flight).cancel_requested and get_task(s, in_flight).state == "leased"
    with transaction(s) as sess:
        reply = wops.heartbeat(sess, w, now=clock.now(), running=[in_flight])
    assert reply.cancel == [in_flight]
    with transaction(s) as sess:
        ops.finish(sess, w, in_flight, now=clock.now(), reason="canceled")
    assert get_task(s, in_flight).state == "canceled"


def test_a_lease_whose_answer_was_lost_expires_though_its_agent_heartbeats(setup, clock) -> None:
    s = setup.sessions
    lost = add_task(s, clock)
    clock.advance(1)
    held = add_task(s, clock)
    w, w2 = add_worker(s, clock), add_worker(s, clock)
    assert lease(s, clock, w).id == lost  # the answer never reaches the agent: it lists nothing
    assert lease(s, clock, w2).id == held  # this agent got its answer: it lists the task
    for _ in range(3):  # heartbeats past LEASE_TTL (90 s)
        clock.advance(40)
        with transaction(s) as sess:
            wops.heartbeat(sess, w, now=clock.now(), running=[])
            wops.heartbeat(sess, w2, now=clock.now(), running=[held])
    with transaction(s) as sess:
        expired = [t.id for t in ops.expire_leases(sess, now=clock.now())]
    assert expired == [lost]
    task = get_task(s, lost)
    assert task.state == "queued" and task.end_reason == "lost:lease_expired" and task.worker_id is None
    assert get_task(s, held).state == "leased"  # a listed lease is renewed by each heartbeat


def test_silent_worker_is_gone_and_its_task_lost_then_requeued(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock)
    w = add_worker(s, clock)
    assert lease(s, clock, w) is not None
    clock.advance(61)
    with transaction(s) as sess:
        gone = wops.expire_silent_workers(sess, now=clock.now(), timeout_s=60)
    assert [g.id for g in gone] == [w]
    task = get_task(s, tid)
    assert task.state == "queued" and task.end_reason == "lost:heartbeat" and task.attempts == 1
    w2 = add_worker(s, clock)
    again = lease(s, clock, w2)
    assert again is not None and again.id == tid and again.attempts == 2
    # The lost worker, if it comes back, is told to stop what it runs and shut down.
    with transaction(s) as sess:
        reply = wops.heartbeat(sess, w, now=clock.now(), running=[tid])
    assert reply.shutdown and reply.cancel == [tid]


def test_transition_table_is_enforced(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock)
    with transaction(s) as sess:
        task = sess.get(ops.Task, tid)
        with pytest.raises(Conflict):
            ops.transition(sess, task, TaskState.SUCCEEDED, reason="x", now=clock.now())  # type: ignore[arg-type]
    for state in (TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELED):
        assert TRANSITIONS[state] == {}


def test_working_dir_path_tricks_refused() -> None:
    from autoscaler.errors import InvalidInput

    assert ops.validate_working_dir("/data/run") == "/data/run"
    for bad in ("relative/dir", "/data/../etc", "/data/\x00x"):
        with pytest.raises(InvalidInput):
            ops.validate_working_dir(bad)
