"""Gangs under concurrency and crashes, through the real queueing functions on SQLite
and PostgreSQL.

- Two workers race to reserve a gang's last rank: exactly one wins, the gang starts
  once (one attempt, N ranks), the loser holds nothing.
- A crash between the N-th reservation and the start: either the transaction that
  reserved the N-th rank never committed (the gang still waits for it and completes
  on the next lease), or it committed and its answer never reached the agent (that
  rank never starts): past the lease deadline the gang is released and requeued,
  never left half started.
"""

from __future__ import annotations

import threading

import pytest

from autoscaler.queueing import gangs
from autoscaler.queueing import tasks as ops
from autoscaler.queueing.tasks import LEASE_TTL
from autoscaler.state.db import transaction
from tests.queueing.helpers import add_task, add_worker, get_task, get_worker, lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def _ranks(sessions, task_id):
    with sessions() as s:
        return sorted((r.attempt, r.rank, r.worker_id, r.state) for r in gangs.all_ranks(s, task_id))


def test_two_workers_racing_for_the_last_rank_one_wins_and_the_gang_starts_once(setup, clock) -> None:
    s = setup.sessions
    first, b, c = add_worker(s, clock), add_worker(s, clock), add_worker(s, clock)
    gang = add_task(s, clock, nodes=2, gpus=1)
    assert lease(s, clock, first) is None  # rank 0 reserved
    barrier = threading.Barrier(2)
    got: dict[str, object] = {}

    def race(worker: str) -> None:
        barrier.wait()
        with transaction(s) as sess:
            task = ops.lease(sess, worker, now=clock.now())
            got[worker] = task.id if task is not None else None

    threads = [threading.Thread(target=race, args=(w,)) for w in (b, c)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [w for w, t in got.items() if t == gang]
    assert len(got) == 2 and len(winners) == 1, got
    loser = c if winners == [b] else b
    assert got[loser] is None and get_worker(s, loser).state == "idle"
    task = get_task(s, gang)
    assert task.state == "leased" and task.attempts == 1
    ranks = _ranks(s, gang)
    assert [(r[1], r[3]) for r in ranks] == [(0, "leased"), (1, "leased")]
    assert {r[2] for r in ranks} == {first, winners[0]}
    # Rank 0's start comes once; the loser is offered nothing of the gang later either.
    assert (lease(s, clock, first) or pytest.fail("no start for rank 0")).id == gang
    assert lease(s, clock, first) is None and lease(s, clock, loser) is None


def test_a_crash_before_the_last_reservation_committed_leaves_the_gang_waiting(setup, clock) -> None:
    s = setup.sessions
    a, b = add_worker(s, clock), add_worker(s, clock)
    gang = add_task(s, clock, nodes=2, gpus=1)
    assert lease(s, clock, a) is None

    class Crash(BaseException):
        pass

    with pytest.raises(Crash), transaction(s) as sess:
        assert ops.lease(sess, b, now=clock.now()) is not None  # the N-th rank, complete...
        raise Crash()  # ...and the process dies before the commit
    assert get_task(s, gang).state == "queued"
    assert _ranks(s, gang) == [(1, 0, a, "reserved")]
    assert get_worker(s, b).state == "idle"
    # After the restart the same worker's next lease completes it, once.
    clock.advance(1)
    assert (lease(s, clock, b) or pytest.fail("the gang did not complete")).id == gang
    assert [r[3] for r in _ranks(s, gang)] == ["leased", "leased"]


def test_a_start_lost_after_the_last_reservation_committed_releases_the_gang_never_half_started(setup, clock) -> None:
    s = setup.sessions
    a, b = add_worker(s, clock), add_worker(s, clock)
    gang = add_task(s, clock, nodes=2, gpus=1)
    assert lease(s, clock, a) is None
    clock.advance(1)
    # The N-th reservation commits and the answer to b is lost (the server died).
    assert (lease(s, clock, b) or pytest.fail("no completion")).id == gang
    assert lease(s, clock, b) is None  # b's agent asks again: its start is not handed twice
    assert (lease(s, clock, a) or pytest.fail("no start for rank 0")).id == gang
    with transaction(s) as sess:
        ops.mark_started(sess, a, gang, now=clock.now())  # rank 0 runs, rank 1 never will
    assert get_task(s, gang).state == "running"
    with transaction(s) as sess:
        assert ops.expire_leases(sess, now=clock.now()) == []  # within the deadline: waits
    clock.advance(LEASE_TTL.total_seconds() + 1)
    with transaction(s) as sess:
        expired = [t.id for t in ops.expire_leases(sess, now=clock.now())]
    assert expired == [gang]
    task = get_task(s, gang)
    assert task.state == "queued" and task.end_reason == "lost:lease_expired" and task.failures == 0
    states = {r[2]: r[3] for r in _ranks(s, gang)}
    assert states[b] == "released"  # never started: nothing to stop
    assert states[a] == "stopping"  # told to stop, keeps its GPUs until its agent reports
    assert get_worker(s, b).state == "idle"
    # A start report that late is refused: the rank is gone.
    with pytest.raises(Exception, match="not leased"), transaction(s) as sess:
        ops.mark_started(sess, b, gang, now=clock.now())
