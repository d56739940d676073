"""The reconcile cycle against the fake provider, a manual clock and the real policy engine."""

from __future__ import annotations

from sqlalchemy import func, select

from autoscaler.planner import plan
from autoscaler.policy.schema import Decision
from autoscaler.reconciler.cycle import CycleResult
from autoscaler.state.models import DecisionRecord, HistoryPoint, InstanceEvent, OfferingBlock, SpendRecord
from providers.base import TAG_REQUEST, TAG_TEAM, CapacityError, LaunchRequest, TransientError
from tests.reconciler.harness import Rig


def test_task_to_launch_ready_idle_drain_terminate(rig: Rig) -> None:
    r = rig.reconciler()
    task = rig.enqueue("vision")
    r.run_cycle()
    (inst,) = rig.instances()
    fake = rig.fakes["gpu-pool"]
    (call,) = fake.calls_of("launch")
    req: LaunchRequest = call.arg
    # The intent's request id is the provider's idempotency key and a tag.
    assert req.request_id == inst.request_id and req.all_tags()[TAG_REQUEST] == inst.request_id
    assert req.tags[TAG_TEAM] == "vision" and req.owner == "test"
    assert (inst.state, inst.capacity_type, inst.team) == ("booting", "spot", "vision")

    wid = rig.register(rig.instance(inst.id))
    r.run_cycle()
    assert rig.instance(inst.id).state == "ready"
    assert rig.lease(wid) == task
    rig.finish(wid, task)
    assert rig.task(task).state == "succeeded"

    rig.clock.advance(301)
    rig.heartbeat(wid)
    res = r.run_cycle()
    assert res.drained == [wid]
    assert rig.worker(wid).state == "draining" and rig.instance(inst.id).state == "draining"
    rig.leave(wid)
    r.run_cycle()
    assert rig.instance(inst.id).state == "terminated"
    assert fake.live() == []
    with rig.sessions() as s:
        states = [
            e.to_state
            for e in s.scalars(
                select(InstanceEvent).where(InstanceEvent.instance_id == inst.id).order_by(InstanceEvent.id)
            )
        ]
        spend = s.scalars(select(SpendRecord)).all()
    assert states == ["requested", "launching", "booting", "ready", "draining", "terminating", "terminated"]
    # Boot and idle time are charged: 301 s at the spot price of 0.4 USD/h.
    assert [(x.team, round(x.cost_usd, 4)) for x in spend] == [("vision", round(301 / 3600 * 0.4, 4))]


def test_capacity_error_blocks_offering_and_next_cycle_falls_back_to_on_demand(rig: Rig) -> None:
    fake = rig.fakes["gpu-pool"]
    fake.fail_when(
        lambda req: req.offering.capacity_type == "spot",
        CapacityError("no spot g.1", code="InsufficientInstanceCapacity"),
    )
    r = rig.reconciler()
    rig.enqueue()
    first = r.run_cycle()
    assert first.launch_errors and not first.launched
    assert [i.state for i in rig.instances()] == ["launch_failed"]
    with rig.sessions() as s:
        (block,) = s.scalars(select(OfferingBlock)).all()
    assert (block.scope, block.key) == ("offering", "spot/g.1/-")
    assert (block.until - rig.clock.now()).total_seconds() == rig.config.reconcile.unavailable_ttl_s

    rig.clock.advance(15)
    second = r.run_cycle()
    assert len(second.launched) == 1
    assert rig.instance(second.launched[0]).capacity_type == "on_demand"
    # After the TTL, spot is tried again.
    rig.clock.advance(rig.config.reconcile.unavailable_ttl_s)
    fake.clear_faults()
    rig.enqueue()
    third = r.run_cycle()
    assert rig.instance(third.launched[0]).capacity_type == "spot"


def test_zone_capacity_error_falls_back_to_other_zone(rig: Rig) -> None:
    pool = rig.config.pools[0].model_copy(update={"zones": ["z1", "z2"], "capacity_types": ["spot"]})
    rig.config = rig.config.model_copy(update={"pools": [pool, rig.config.pools[1]]})
    from autoscaler.provisioning import catalog_offerings
    from providers.fake import FakeProvider

    fake = FakeProvider(catalog_offerings(pool), clock=rig.clock.now)
    fake.set_capacity("spot/g.1/z1", 0)
    rig.fakes["gpu-pool"] = fake
    r = rig.reconciler()
    rig.enqueue()
    assert r.run_cycle().launch_errors
    rig.clock.advance(15)
    res = r.run_cycle()
    assert rig.instance(res.launched[0]).zone == "z2"


def test_transient_error_keeps_intent_and_retries_with_same_request_id(rig: Rig) -> None:
    fake = rig.fakes["gpu-pool"]
    fake.fail_next(TransientError("503 from the API"))
    r = rig.reconciler()
    rig.enqueue()
    r.run_cycle()
    (inst,) = rig.instances()
    assert inst.state == "launching"
    rig.clock.advance(15)
    r.run_cycle()
    ids = {c.arg.request_id for c in fake.calls_of("launch")}
    assert ids == {inst.request_id} and len(fake.live()) == 1
    assert rig.instance(inst.id).state == "booting"


def test_orphan_with_owner_tag_is_terminated_after_grace(rig: Rig) -> None:
    fake = rig.fakes["gpu-pool"]
    offering = fake.offerings()[0]
    (orphan,) = fake.launch(LaunchRequest("not-ours-1", "gpu-pool", "test", offering))
    (foreign,) = fake.launch(LaunchRequest("other-deploy", "gpu-pool", "someone-else", offering))
    r = rig.reconciler()
    assert r.run_cycle().orphans == []
    rig.clock.advance(rig.config.reconcile.orphan_grace_s)
    assert r.run_cycle().orphans == [orphan.instance_id]
    assert [i.instance_id for i in fake.live()] == [foreign.instance_id]


def test_vanished_instance_becomes_lost_then_terminated_and_is_replaced(rig: Rig) -> None:
    r = rig.reconciler()
    task = rig.enqueue()
    r.run_cycle()
    (inst,) = rig.instances()
    wid = rig.register(rig.instance(inst.id))
    r.run_cycle()
    assert rig.lease(wid) == task
    rig.fakes["gpu-pool"].terminate([rig.instance(inst.id).provider_instance_id or ""])
    r.run_cycle()
    assert rig.instance(inst.id).state == "ready"  # one listing is not enough
    rig.clock.advance(rig.config.reconcile.orphan_grace_s)
    rig.heartbeat(wid)
    res = r.run_cycle()
    assert res.lost == [inst.id]
    assert rig.instance(inst.id).state == "terminated"


def test_boot_timeout_terminates_and_replaces(rig: Rig) -> None:
    r = rig.reconciler()
    rig.enqueue()
    r.run_cycle()
    (inst,) = rig.instances()
    rig.clock.advance(rig.config.pools[0].boot_timeout_s)
    res = r.run_cycle()
    assert rig.instance(inst.id).state == "terminated"
    with rig.sessions() as s:
        states = list(s.scalars(select(InstanceEvent.to_state).where(InstanceEvent.instance_id == inst.id)))
    assert "boot_timeout" in states
    assert len(res.launched) == 1 and res.launched[0] != inst.id


def test_preemption_terminates_and_relaunches_for_the_requeued_task(rig: Rig) -> None:
    r = rig.reconciler()
    task = rig.enqueue()
    r.run_cycle()
    (inst,) = rig.instances()
    wid = rig.register(rig.instance(inst.id))
    r.run_cycle()
    assert rig.lease(wid) == task
    fake = rig.fakes["gpu-pool"]
    fake.preempt(rig.instance(inst.id).provider_instance_id or "")
    # The agent saw the notice: its task is interrupted ("spot") and requeued; it leaves.
    rig.finish(wid, task, reason="interrupted", detail="spot")
    rig.leave(wid)
    assert rig.task(task).state == "queued"
    res = r.run_cycle()
    assert res.preempted == [inst.id]
    assert rig.instance(inst.id).state == "terminated"
    assert len(res.launched) == 1
    assert len(fake.live()) == 1


def test_drain_is_refused_when_the_worker_leased_meanwhile(rig: Rig) -> None:
    r = rig.reconciler()
    rig.enqueue()
    r.run_cycle()
    (inst,) = rig.instances()
    wid = rig.register(rig.instance(inst.id))
    r.run_cycle()
    task = rig.lease(wid)
    assert task
    rig.finish(wid, task)
    rig.clock.advance(400)
    rig.heartbeat(wid)
    # The plan is made while the worker is idle; a task arrives and is leased before the act.
    snap = r.observe(rig.clock.now())
    the_plan = plan(snap.plan_input(Decision()))
    assert [d.worker_id for d in the_plan.drains] == [wid]
    rig.enqueue()
    assert rig.lease(wid) is not None
    result = CycleResult(at=rig.clock.now(), plan=the_plan)
    r.act(the_plan, rig.clock.now(), result)
    assert result.drained == [] and wid in result.drains_refused[0]
    assert rig.worker(wid).state == "busy" and rig.instance(inst.id).state == "ready"


def test_every_cycle_records_a_decision_and_history(rig: Rig) -> None:
    r = rig.reconciler()
    rig.enqueue("vision")
    rig.enqueue("nlp", gpus=0, queue="cpu")
    res = r.run_cycle()
    with rig.sessions() as s:
        row = s.get(DecisionRecord, res.decision_id)
        points = s.scalar(select(func.count()).select_from(HistoryPoint))
    assert row is not None and row.policy_revision == rig.policy.revision
    assert row.summary["pending_tasks"] == 2 and row.plan["launches_count"] == 2
    assert any("launch 1 x spot/g.1/- in pool gpu-pool for team vision" in line for line in row.reasons)
    assert any("no monthly budget" in line for line in row.reasons)  # the shipped policy's warning
    assert points and points > 0
