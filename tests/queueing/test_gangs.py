"""Multi-node tasks (gangs) through the real queueing functions, on SQLite and PostgreSQL:
all ranks start together or none does, reservations hold GPUs and time out, any rank's
end ends the whole gang's attempt, and admission counts the whole gang."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from autoscaler.admission.shapes import Catalog
from autoscaler.config import parse_config
from autoscaler.errors import InvalidInput
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.queueing import gangs
from autoscaler.queueing import tasks as ops
from autoscaler.queueing import workers as wops
from autoscaler.state.db import transaction
from autoscaler.state.models import Task, TaskAttempt, TaskRank
from tests.conftest import TEST_CONFIG
from tests.queueing.helpers import add_task, add_worker, decide, get_task, get_worker, lease


@pytest.fixture
def setup(ctx, clock):
    from tests.conftest import make_context

    return make_context(ctx.config, ctx.sessions, clock)


def _ranks(sessions, task_id):
    with sessions() as s:
        return [(r.rank, r.worker_id, r.state) for r in gangs.all_ranks(s, task_id)]


def _finish(sessions, clock, worker, task, **kw):
    with transaction(sessions) as s:
        return ops.finish(s, worker, task, now=clock.now(), **kw).state


def _start(sessions, clock, worker, task):
    with transaction(sessions) as s:
        ops.mark_started(s, worker, task, now=clock.now())


def test_a_gang_starts_only_when_every_rank_is_reserved(setup, clock) -> None:
    s = setup.sessions
    a, b = add_worker(s, clock), add_worker(s, clock)
    gang = add_task(s, clock, nodes=2, gpus=1)
    assert lease(s, clock, a) is None  # rank 0 reserved; nothing starts yet
    assert get_task(s, gang).state == "queued"
    assert get_worker(s, a).state == "busy"
    clock.advance(1)
    got = lease(s, clock, b)
    assert got is not None and got.id == gang
    assert get_task(s, gang).state == "leased"
    # The first worker's next lease is its start; a second one gets nothing more.
    assert (lease(s, clock, a) or pytest.fail("no start for rank 0")).id == gang
    assert lease(s, clock, a) is None
    assert sorted(_ranks(s, gang)) == [(0, a, "leased"), (1, b, "leased")]
    with s() as sess:
        task = get_task(s, gang)
        rank1 = gangs.rank_of(sess, gang, b)
        assert rank1 is not None
        env = gangs.rendezvous_env(sess, task, rank1)
    assert env["NNODES"] == "2" and env["NODE_RANK"] == "1" and env["WORLD_SIZE"] == "2"
    assert env["GPUS_PER_NODE"] == "1" and env["AUTOSCALER_GANG_ID"] == gang
    assert env["MASTER_PORT"] == str(gangs.master_port(gang)) and 29500 <= int(env["MASTER_PORT"]) < 30500
    assert env["MASTER_ADDR"] == "host"  # rank 0's worker reported no address: its hostname


def test_reserved_gpus_are_not_offered_to_other_tasks(setup, clock) -> None:
    s = setup.sessions
    a = add_worker(s, clock)
    add_task(s, clock, nodes=2, gpus=1)
    clock.advance(1)
    single = add_task(s, clock, gpus=1)
    assert lease(s, clock, a) is None  # the gang's rank 0 holds its only GPU
    assert lease(s, clock, a) is None  # and the single task is not offered it
    assert get_task(s, single).state == "queued"


def test_one_rank_per_machine(setup, clock) -> None:
    s = setup.sessions
    big = add_worker(s, clock, gpus=4)
    gang = add_task(s, clock, nodes=2, gpus=1)
    assert lease(s, clock, big) is None
    assert lease(s, clock, big) is None  # a second rank of the same gang never lands on it
    assert len(_ranks(s, gang)) == 1


def test_a_partial_reservation_is_released_after_its_timeout(setup, clock) -> None:
    s = setup.sessions
    a, b = add_worker(s, clock), add_worker(s, clock)
    gang = add_task(s, clock, nodes=3, gpus=1)
    clock.advance(1)
    single = add_task(s, clock, gpus=1)
    settings = gangs.GangSettings(reservation_timeout_s=60)
    assert lease(s, clock, a, gang_settings=settings) is None
    assert lease(s, clock, b, gang_settings=settings) is None
    clock.advance(59)
    assert lease(s, clock, a, gang_settings=settings) is None  # not yet: a still holds rank 0
    clock.advance(2)
    got = lease(s, clock, a, gang_settings=settings)
    assert got is not None and got.id == single  # released: the GPU went to the waiting task
    assert {st for _r, _w, st in _ranks(s, gang)} == {"released"}
    assert get_task(s, gang).state == "queued"
    with s() as sess:  # the reservation's time was the gang's team's
        rows = list(sess.scalars(select(TaskAttempt).where(TaskAttempt.task_id == gang)))
    assert len(rows) == 2 and all(r.ended_at is not None and r.team == "vision" for r in rows)


def _running_gang(s, clock, nodes=2):
    workers = [add_worker(s, clock) for _ in range(nodes)]
    gang = add_task(s, clock, nodes=nodes, gpus=1, max_attempts=2)
    for w in workers:
        lease(s, clock, w)
    for w in workers[:-1]:
        assert (lease(s, clock, w) or pytest.fail("no start")).id == gang
    for w in workers:
        _start(s, clock, w, gang)
    assert get_task(s, gang).state == "running"
    return gang, workers


def test_the_gang_succeeds_when_every_rank_exits_0(setup, clock) -> None:
    s = setup.sessions
    gang, (a, b) = _running_gang(s, clock)
    assert _finish(s, clock, a, gang, reason="exit", exit_code=0) == "running"
    assert get_worker(s, a).state == "idle"
    assert _finish(s, clock, b, gang, reason="exit", exit_code=0) == "succeeded"


def test_one_rank_failing_stops_the_others_and_requeues_the_gang(setup, clock) -> None:
    s = setup.sessions
    gang, (a, b) = _running_gang(s, clock)
    assert _finish(s, clock, a, gang, reason="exit", exit_code=3) == "queued"
    task = get_task(s, gang)
    assert task.failures == 1 and task.interruptions == 0
    assert sorted(st for _r, _w, st in _ranks(s, gang)) == ["exited", "stopping"]
    # The other rank's worker is told to stop it; its GPUs stay held until it has.
    with transaction(s) as sess:
        reply = wops.heartbeat(sess, b, now=clock.now(), running=[gang])
    assert reply.cancel == [gang]
    assert get_worker(s, b).state == "busy"
    assert _finish(s, clock, b, gang, reason="canceled") == "queued"  # a stopped rank changes nothing
    assert get_worker(s, b).state == "idle"
    # Requeued as one: both ranks again, a new attempt.
    lease(s, clock, a)
    lease(s, clock, b)
    assert get_task(s, gang).state == "leased" and get_task(s, gang).attempts == 2


def test_a_lost_worker_requeues_the_gang_without_spending_an_attempt(setup, clock) -> None:
    s = setup.sessions
    gang, (a, b) = _running_gang(s, clock)
    with transaction(s) as sess:
        wops.deregister(sess, b, now=clock.now(), reason="spot")
    task = get_task(s, gang)
    assert task.state == "queued" and task.failures == 0 and task.interruptions == 1
    with transaction(s) as sess:
        reply = wops.heartbeat(sess, a, now=clock.now(), running=[gang])
    assert reply.cancel == [gang]


def test_a_drain_of_one_rank_interrupts_the_whole_gang(setup, clock) -> None:
    s = setup.sessions
    gang, (a, _b, _c) = _running_gang(s, clock, nodes=3)
    assert _finish(s, clock, a, gang, reason="interrupted", detail="drain") == "queued"
    task = get_task(s, gang)
    assert task.failures == 0 and task.interruptions == 1
    assert task.end_reason == "interrupted:drain"
    assert sorted(st for _r, _w, st in _ranks(s, gang)) == ["exited", "stopping", "stopping"]


def test_canceling_a_reserving_gang_releases_its_ranks(setup, clock) -> None:
    s = setup.sessions
    a = add_worker(s, clock)
    gang = add_task(s, clock, nodes=2, gpus=1)
    lease(s, clock, a)
    with transaction(s) as sess:
        row = sess.get(Task, gang)
        assert row is not None
        ops.cancel(sess, row, now=clock.now())
    assert get_task(s, gang).state == "canceled"
    assert get_worker(s, a).state == "idle"


def test_a_drain_only_if_idle_never_takes_a_worker_holding_a_rank(setup, clock) -> None:
    s = setup.sessions
    a = add_worker(s, clock)
    add_task(s, clock, nodes=2, gpus=1)
    lease(s, clock, a)
    with transaction(s) as sess, pytest.raises(Exception, match="meanwhile"):
        wops.drain(sess, a, now=clock.now(), deadline_s=60, reason="idle", only_if_idle=True)


def test_quota_counts_the_whole_gang(setup, clock) -> None:
    s = setup.sessions
    workers = [add_worker(s, clock, tenancy="shared") for _ in range(3)]
    decide(s, clock, Decision(teams={"vision": TeamDecision(nominal_gpus=2, borrowing_limit_gpus=0)}))
    too_wide = add_task(s, clock, nodes=3, gpus=1)
    clock.advance(1)
    fits = add_task(s, clock, nodes=2, gpus=1)
    for w in workers:
        lease(s, clock, w)
    assert get_task(s, too_wide).state == "queued"
    with s() as sess:
        assert not list(sess.scalars(select(TaskRank).where(TaskRank.task_id == too_wide)))
    assert get_task(s, fits).state == "leased"


def test_enqueue_refuses_a_gang_no_pool_can_hold(setup, clock) -> None:
    config = parse_config(TEST_CONFIG, Path("test.yaml"))
    shapes = Catalog.from_config(config)
    with transaction(setup.sessions) as sess:
        spec = ops.TaskSpec(queue="gpu", command=["true"], gpus=1, nodes=5)
        with pytest.raises(InvalidInput, match=r"needs 5 machines at once.*more than 4"):
            ops.enqueue(sess, spec, team="vision", now=clock.now(), shapes=shapes)
        spec = ops.TaskSpec(queue="gpu", command=["true"], gpus=2, nodes=2)
        with pytest.raises(InvalidInput, match="2 GPUs"):
            ops.enqueue(sess, spec, team="vision", now=clock.now(), shapes=shapes)
        with pytest.raises(InvalidInput, match="nodes must be"):
            ops.enqueue(sess, ops.TaskSpec(queue="gpu", command=["true"], nodes=0), team="vision", now=clock.now())
        ok = ops.enqueue(
            sess,
            ops.TaskSpec(queue="gpu", command=["true"], gpus=1, nodes=4),
            team="vision",
            now=clock.now(),
            shapes=shapes,
        )
        assert ok.nodes == 4
