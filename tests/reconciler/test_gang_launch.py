"""A gang's missing machines go out as ONE provider call, `LaunchRequest(nodes=k,
gang=<task id>)`, through the real reconciler on the fake cloud and a real database.

The promises, each tried: one call (not k) and k rows, each with a distinct instance
of it; no second call while they boot; an error for the gang fails every row (no
half gang left billing, nothing retried under the failed request id, and the next
attempt takes a new one); a crash after the intent or after the call neither leaks a
machine nor launches twice, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from autoscaler.queueing import tasks as task_ops
from autoscaler.state.db import transaction
from providers.base import CapacityError, LaunchRequest, ProviderError, TransientError
from tests.reconciler.harness import Rig
from tests.reconciler.test_crash_and_budget import crash_in_a_launch


def enqueue_gang(rig: Rig, nodes: int = 2, gpus: int = 1) -> str:
    with transaction(rig.sessions) as s:
        spec = task_ops.TaskSpec(queue="gpu", command=["python", "-c", "print(42)"], gpus=gpus, nodes=nodes)
        return task_ops.enqueue(s, spec, team="vision", now=rig.clock.now()).id


def gang_requests(rig: Rig) -> list[LaunchRequest]:
    return [c.arg for c in rig.fakes["gpu-pool"].calls_of("launch")]


def test_a_gang_is_one_launch_call_and_k_rows(rig: Rig) -> None:
    task_id = enqueue_gang(rig, nodes=3)
    r = rig.reconciler()
    r.run_cycle()
    (request,) = gang_requests(rig)
    assert (request.nodes, request.gang) == (3, task_id)
    rows = rig.instances()
    assert len(rows) == 3 and {i.state for i in rows} == {"booting"}
    assert {i.launch_request_id for i in rows} == {request.request_id}
    assert {i.gang_id for i in rows} == {task_id}
    assert len({i.provider_instance_id for i in rows}) == 3
    assert len({i.request_id for i in rows}) == 3  # each row keeps its own (unique) request id
    # While they boot they are the gang's machines: nothing more is launched.
    rig.clock.advance(10)
    r.run_cycle()
    assert len(gang_requests(rig)) == 1 and len(rig.fakes["gpu-pool"].live()) == 3


def test_an_idle_machine_that_fits_counts_and_only_the_rest_is_launched(rig: Rig) -> None:
    rig.enqueue()
    r = rig.reconciler()
    r.run_cycle()
    (single,) = rig.instances()
    worker = rig.register(single)
    task = rig.lease(worker)
    assert task is not None
    rig.finish(worker, task)
    task_id = enqueue_gang(rig, nodes=3)
    rig.clock.advance(5)
    r.run_cycle()
    gang = gang_requests(rig)[-1]
    assert (gang.nodes, gang.gang) == (2, task_id)


@pytest.mark.parametrize("error", [CapacityError("no capacity for 2"), TransientError("timed out")])
def test_an_error_fails_the_whole_gang_and_the_retry_takes_a_new_request_id(rig: Rig, error: ProviderError) -> None:
    fake = rig.fakes["gpu-pool"]
    enqueue_gang(rig)
    fake.fail_when(lambda req: isinstance(req, LaunchRequest) and req.nodes == 2, error, times=1)
    r = rig.reconciler()
    res = r.run_cycle()
    assert res.launch_errors
    first = gang_requests(rig)[0]
    rows = rig.instances()
    assert len(rows) == 2 and {i.state for i in rows} == {"launch_failed"}
    assert fake.live() == []  # no half gang billing
    rig.clock.advance(600)  # past the backoff and the offering block
    r.run_cycle()
    again = gang_requests(rig)[-1]
    assert again.nodes == 2 and again.request_id != first.request_id
    assert len(fake.live()) == 2
    assert sum(1 for c in gang_requests(rig) if c.request_id == first.request_id) == 1


@pytest.mark.parametrize("after_call", [False, True], ids=["before-call", "after-call"])
def test_a_crash_around_a_gang_launch_neither_leaks_nor_launches_twice(
    any_rig: Rig, config: AutoscalerConfig, clock: ManualClock, after_call: bool
) -> None:
    rig = any_rig
    enqueue_gang(rig)
    fake = crash_in_a_launch(rig, after_call=after_call)
    intents = rig.instances()
    assert len(intents) == 2 and {i.state for i in intents} == {"launching"}
    assert len(fake.live()) == (2 if after_call else 0)

    # A new process, nothing in memory, well past the orphan grace period.
    clock.advance(config.reconcile.orphan_grace_s + 1)
    res = rig.reconciler().run_cycle()
    rows = rig.instances()
    assert [i.id for i in rows] == [i.id for i in intents] and {i.state for i in rows} == {"booting"}
    live = {i.instance_id for i in fake.live()}
    assert len(live) == 2 and {i.provider_instance_id for i in rows} == live
    assert res.orphans == [] and not fake.calls_of("terminate")
    assert {c.request_id for c in gang_requests(rig)} == {intents[0].launch_request_id}
    assert (sorted(res.adopted) == sorted(i.id for i in rows)) == after_call


def test_the_sync_gives_each_row_of_a_gang_launch_its_own_instance_and_one_more_is_an_orphan() -> None:
    from datetime import UTC, datetime, timedelta

    from autoscaler.reconciler import sync
    from autoscaler.reconciler.states import InstanceState
    from providers.base import InstanceStatus, ProviderInstance

    now = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    old = now - timedelta(hours=1)
    rows = [
        sync.Row("a", "p", "R", InstanceState.LAUNCHING, created_at=old, launch_request_id="R"),
        sync.Row("b", "p", "R-2", InstanceState.LAUNCHING, created_at=old, launch_request_id="R"),
    ]
    listed = [
        ProviderInstance(f"i{n}", "R", "p", "g.1", "spot", None, InstanceStatus.RUNNING, launched_at=old)
        for n in (1, 2, 3)
    ]
    out = sync.passive_sync(
        rows,
        sync.Observation({"p": listed}),
        now,
        sync.Settings(orphan_grace=timedelta(seconds=60)),
        sync.Memory(orphan_seen={"i3": now - timedelta(minutes=2)}),
    )
    adopted = {c.row_id: c.instance.instance_id for c in out.changes if isinstance(c, sync.Adopt)}
    assert adopted == {"a": "i1", "b": "i2"}
    assert out.orphans == ("i3",)
