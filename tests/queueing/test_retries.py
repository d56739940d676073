"""Retries that mean what they say, through the real queueing functions, on SQLite and
PostgreSQL: `max_attempts` bounds the task's own failed attempts (non-zero exit,
timeout), `retry_on_exit_codes` narrows which are retried, and attempts the machine
ended (spot, drain, deregistration, lost heartbeat, expired lease) never spend it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.errors import InvalidInput
from autoscaler.queueing import tasks as ops
from autoscaler.queueing import workers as wops
from autoscaler.state.db import transaction
from autoscaler.state.models import TaskEvent
from tests.queueing.helpers import add_task, add_worker, get_task, get_worker, lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def run_once(setup: Any, clock: Any, worker: str, task_id: str, *, start: bool = True, **finish: Any) -> None:
    """Lease `task_id` on `worker` (it must be the one leased), start it, end it."""
    s = setup.sessions
    t = lease(s, clock, worker)
    assert t is not None and t.id == task_id, t
    with transaction(s) as sess:
        if start:
            ops.mark_started(sess, worker, task_id, now=clock.now())
        ops.finish(sess, worker, task_id, now=clock.now(), **finish)
    clock.advance(1)


def events(setup: Any, task_id: str) -> list[TaskEvent]:
    with setup.sessions() as sess:
        return list(sess.scalars(select(TaskEvent).where(TaskEvent.task_id == task_id).order_by(TaskEvent.id)))


def test_a_non_zero_exit_is_retried_until_max_attempts_then_fails(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=3)
    w = add_worker(s, clock)
    for n in (1, 2):
        run_once(setup, clock, w, tid, reason="exit", exit_code=1)
        task = get_task(s, tid)
        assert (task.state, task.failures, task.attempts, task.exit_code) == ("queued", n, n, 1)
        assert task.worker_id is None and task.gpu_indices == [] and task.finished_at is None
        assert get_worker(s, w).state == "idle"
    run_once(setup, clock, w, tid, reason="exit", exit_code=1)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.attempts, task.interruptions) == ("failed", 3, 3, 0)
    assert (task.exit_code, task.end_reason) == (1, "exit_code") and task.finished_at is not None
    # The history keeps each attempt's exit code and why it was (not) retried.
    ends = [(e.attempt, e.from_state, e.to_state, e.reason) for e in events(setup, tid) if e.from_state == "running"]
    assert ends == [
        (1, "running", "queued", "exit 1"),
        (2, "running", "queued", "exit 1"),
        (3, "running", "failed", "exit 1"),
    ]
    details = [e.detail for e in events(setup, tid) if e.from_state == "running"]
    assert details[0].startswith("failed attempt 1 of 3: requeued behind waiting work")
    assert details[2].startswith("max_attempts reached: failed attempts 3 of 3")
    assert lease(s, clock, w) is None


def test_max_attempts_one_means_no_retry(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=1)
    w = add_worker(s, clock)
    run_once(setup, clock, w, tid, reason="exit", exit_code=2)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.exit_code) == ("failed", 1, 2)


def test_a_retry_then_success_ends_succeeded_with_the_failure_counted(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=2)
    w = add_worker(s, clock)
    run_once(setup, clock, w, tid, reason="exit", exit_code=1)
    run_once(setup, clock, w, tid, reason="exit", exit_code=0)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.attempts, task.exit_code) == ("succeeded", 1, 2, 0)


def test_an_exit_before_the_start_report_is_retried_too(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=2)
    w = add_worker(s, clock)
    run_once(setup, clock, w, tid, start=False, reason="exit", exit_code=1)
    task = get_task(s, tid)
    assert (task.state, task.failures) == ("queued", 1)
    assert [(e.from_state, e.to_state) for e in events(setup, tid)][-1] == ("leased", "queued")


def test_a_retried_failure_goes_behind_waiting_work_an_interruption_to_the_head(setup, clock) -> None:
    s = setup.sessions
    crashing = add_task(s, clock, max_attempts=5)
    clock.advance(5)
    waiting = add_task(s, clock)
    w = add_worker(s, clock)
    clock.advance(1)
    run_once(setup, clock, w, crashing, reason="exit", exit_code=1)
    # The crash-looping task does not starve the one that waited: it is next.
    t = lease(s, clock, w)
    assert t is not None and t.id == waiting
    with transaction(s) as sess:
        ops.finish(sess, w, waiting, now=clock.now(), reason="interrupted", detail="spot")
    clock.advance(1)
    # An interrupted task keeps its place at the head of the queue.
    t = lease(s, clock, w)
    assert t is not None and t.id == waiting


def test_only_listed_exit_codes_are_retried(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock)
    listed = add_task(s, clock, max_attempts=3, retry_on_exit_codes=[137, 1, 1])
    assert get_task(s, listed).retry_on_exit_codes == [1, 137]  # sorted, no duplicates
    run_once(setup, clock, w, listed, reason="exit", exit_code=137)
    # The agent reports a death by SIGKILL as -9: it matches a listed 128+9.
    run_once(setup, clock, w, listed, reason="exit", exit_code=-9, detail="killed by SIGKILL")
    task = get_task(s, listed)
    assert (task.state, task.failures) == ("queued", 2)
    run_once(setup, clock, w, listed, reason="exit", exit_code=1)
    assert (get_task(s, listed).state, get_task(s, listed).failures) == ("failed", 3)

    unlisted = add_task(s, clock, max_attempts=3, retry_on_exit_codes=[1, 137])
    run_once(setup, clock, w, unlisted, reason="exit", exit_code=2)
    task = get_task(s, unlisted)
    assert (task.state, task.failures, task.exit_code) == ("failed", 1, 2)
    assert "exit code 2 is not one of retry_on_exit_codes [1, 137]" in events(setup, unlisted)[-1].detail

    # SIGTERM (-15) is 143, not listed; a listed 137 does not match an exit 9.
    for code in (-15, 9):
        other = add_task(s, clock, max_attempts=3, retry_on_exit_codes=[137])
        run_once(setup, clock, w, other, reason="exit", exit_code=code)
        assert get_task(s, other).state == "failed"


def test_timeouts_are_retried_unless_a_code_list_is_given(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock)
    plain = add_task(s, clock, max_attempts=2, timeout_s=10)
    run_once(setup, clock, w, plain, reason="timeout", exit_code=-15)
    assert (get_task(s, plain).state, get_task(s, plain).failures) == ("queued", 1)
    run_once(setup, clock, w, plain, reason="timeout", exit_code=-15)
    task = get_task(s, plain)
    assert (task.state, task.failures, task.end_reason) == ("failed", 2, "timeout")

    narrowed = add_task(s, clock, max_attempts=3, timeout_s=10, retry_on_exit_codes=[1])
    run_once(setup, clock, w, narrowed, reason="timeout", exit_code=-15)
    task = get_task(s, narrowed)
    assert (task.state, task.failures, task.end_reason) == ("failed", 1, "timeout")
    assert "a timeout is not one of retry_on_exit_codes [1]" in events(setup, narrowed)[-1].detail


def test_a_program_that_cannot_start_is_not_retried(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock)
    tid = add_task(s, clock, max_attempts=3)
    run_once(setup, clock, w, tid, start=False, reason="start_failed", detail="No such file or directory")
    task = get_task(s, tid)
    assert (task.state, task.failures, task.end_reason) == ("failed", 1, "start_failed")
    assert "cannot start is not retried" in events(setup, tid)[-1].detail


def _spot(setup: Any, clock: Any, w: str, tid: str) -> str:
    run_once(setup, clock, w, tid, reason="interrupted", detail="spot")
    return w


def _drain(setup: Any, clock: Any, w: str, tid: str) -> str:
    run_once(setup, clock, w, tid, reason="interrupted", detail="drain")
    return w


def _deregistered(setup: Any, clock: Any, w: str, tid: str) -> str:
    assert lease(setup.sessions, clock, w) is not None
    with transaction(setup.sessions) as sess:
        wops.deregister(sess, w, now=clock.now(), reason="reclaimed")
    return add_worker(setup.sessions, clock)


def _lost_heartbeat(setup: Any, clock: Any, w: str, tid: str) -> str:
    assert lease(setup.sessions, clock, w) is not None
    with transaction(setup.sessions) as sess:
        ops.mark_started(sess, w, tid, now=clock.now())
    clock.advance(61)
    with transaction(setup.sessions) as sess:
        assert [g.id for g in wops.expire_silent_workers(sess, now=clock.now(), timeout_s=60)] == [w]
    return add_worker(setup.sessions, clock)


def _lease_expired(setup: Any, clock: Any, w: str, tid: str) -> str:
    assert lease(setup.sessions, clock, w) is not None
    clock.advance(ops.LEASE_TTL.total_seconds() + 1)
    with transaction(setup.sessions) as sess:
        assert [t.id for t in ops.expire_leases(sess, now=clock.now())] == [tid]
    return w


def _machine_lost(setup: Any, clock: Any, w: str, tid: str) -> str:
    assert lease(setup.sessions, clock, w) is not None
    with transaction(setup.sessions) as sess:
        ops.interrupt_worker_tasks(sess, w, now=clock.now(), reason="instance vanished", lost=True)
    return w


INTERRUPTIONS: list[Callable[[Any, Any, str, str], str]] = [
    _spot,
    _drain,
    _deregistered,
    _lost_heartbeat,
    _lease_expired,
    _machine_lost,
]


def test_interruptions_of_every_kind_never_spend_attempts(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=1)
    w = add_worker(s, clock)
    ends = []
    for i in range(10):
        w = INTERRUPTIONS[i % len(INTERRUPTIONS)](setup, clock, w, tid)
        task = get_task(s, tid)
        assert (task.state, task.failures, task.interruptions) == ("queued", 0, i + 1), task.end_reason
        ends.append(task.end_reason)
        clock.advance(1)
    assert set(ends) == {
        "interrupted:spot",
        "interrupted:drain",
        "interrupted:reclaimed",
        "lost:heartbeat",
        "lost:lease_expired",
        "lost:instance vanished",
    }
    # Ten interruptions later, the task with max_attempts 1 still runs, and succeeds.
    run_once(setup, clock, w, tid, reason="exit", exit_code=0)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.interruptions, task.attempts) == ("succeeded", 0, 10, 11)


def test_interruptions_and_failures_are_counted_apart(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=2)
    w = add_worker(s, clock)
    run_once(setup, clock, w, tid, reason="exit", exit_code=1)
    w = _lost_heartbeat(setup, clock, w, tid)
    w = _spot(setup, clock, w, tid)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.interruptions) == ("queued", 1, 2)
    run_once(setup, clock, w, tid, reason="exit", exit_code=1)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.interruptions, task.attempts) == ("failed", 2, 2, 4)


def test_machine_caused_ends_still_stop_at_max_interruptions(setup, clock, monkeypatch) -> None:
    monkeypatch.setattr(ops, "MAX_INTERRUPTIONS", 2)
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=100)
    w = add_worker(s, clock)
    for _ in range(3):
        w = _lost_heartbeat(setup, clock, w, tid)
    task = get_task(s, tid)
    assert (task.state, task.failures, task.interruptions) == ("failed", 0, 3)
    assert events(setup, tid)[-1].reason == "max_interruptions"


def test_cancel_wins_over_a_retry(setup, clock) -> None:
    s = setup.sessions
    w = add_worker(s, clock)
    # Canceled while it waits for its retry: removed at once, never leased again.
    waiting = add_task(s, clock, max_attempts=3)
    run_once(setup, clock, w, waiting, reason="exit", exit_code=1)
    with transaction(s) as sess:
        ops.cancel(sess, sess.get(ops.Task, waiting), now=clock.now())  # type: ignore[arg-type]
    assert get_task(s, waiting).state == "canceled"
    assert lease(s, clock, w) is None
    # Canceled while it runs, then it exits non-zero (say, on SIGTERM): canceled, no retry.
    running = add_task(s, clock, max_attempts=3)
    assert lease(s, clock, w) is not None
    with transaction(s) as sess:
        ops.mark_started(sess, w, running, now=clock.now())
        ops.cancel(sess, sess.get(ops.Task, running), now=clock.now())  # type: ignore[arg-type]
        ops.finish(sess, w, running, now=clock.now(), reason="exit", exit_code=1)
    task = get_task(s, running)
    assert (task.state, task.failures) == ("canceled", 0)
    # Canceled while it runs, then timed out: canceled too.
    timed = add_task(s, clock, max_attempts=3, timeout_s=5)
    assert lease(s, clock, w) is not None
    with transaction(s) as sess:
        ops.cancel(sess, sess.get(ops.Task, timed), now=clock.now())  # type: ignore[arg-type]
        ops.finish(sess, w, timed, now=clock.now(), reason="timeout", exit_code=-15)
    assert get_task(s, timed).state == "canceled"
    assert lease(s, clock, w) is None


def test_a_retried_report_does_not_spend_a_second_attempt(setup, clock) -> None:
    s = setup.sessions
    tid = add_task(s, clock, max_attempts=3)
    w = add_worker(s, clock)
    run_once(setup, clock, w, tid, reason="exit", exit_code=1)
    # The agent's retried report of the same attempt, after the task went back to the queue.
    with transaction(s) as sess, pytest.raises(ops.NotFound):
        ops.finish(sess, w, tid, now=clock.now(), reason="exit", exit_code=1)
    assert get_task(s, tid).failures == 1


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be 1-100"),
        ({"max_attempts": 101}, "max_attempts must be 1-100"),
        ({"retry_on_exit_codes": [0]}, "0 is not an exit code 1-255"),
        ({"retry_on_exit_codes": [256]}, "256 is not an exit code 1-255"),
        ({"retry_on_exit_codes": [1, -9]}, "-9 is not an exit code 1-255"),
        ({"retry_on_exit_codes": list(range(1, 100))}, "at most 64"),
    ],
)
def test_enqueue_refuses_bad_retry_settings(setup, clock, kw: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        add_task(setup.sessions, clock, **kw)
