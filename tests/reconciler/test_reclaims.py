"""Reclaims recorded as reclaims (issue 17, item 3): a spot notice, whether the agent's
metadata watcher or the provider's interruption events report it, ends the instance
`preempted` with the notice's words in its history, on every cloud; a rebalance
recommendation stops new leases and gets queued work a replacement without
interrupting the running task."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from autoscaler.metrics.collector import snapshot_families
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as worker_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import DecisionRecord, InstanceEvent
from providers.base import Capabilities, InterruptionEvent
from tests.reconciler.harness import Rig

GCP_LIKE = Capabilities(interruption_events=False)


def _history(rig: Rig, inst_id: str) -> list[tuple[str | None, str, str]]:
    with rig.sessions() as s:
        rows = s.execute(
            select(InstanceEvent.from_state, InstanceEvent.to_state, InstanceEvent.reason)
            .where(InstanceEvent.instance_id == inst_id)
            .order_by(InstanceEvent.id)
        )
        return [(a, b, c) for a, b, c in rows]


def _running_worker(rig: Rig) -> tuple[str, str, str]:
    """One instance launched for one task, its agent registered and running the task."""
    r = rig.reconciler()
    task = rig.enqueue()
    r.run_cycle()
    (inst,) = rig.instances()
    wid = rig.register(rig.instance(inst.id))
    r.run_cycle()
    assert rig.instance(inst.id).state == "ready"
    assert rig.lease(wid) == task
    with transaction(rig.sessions) as s:
        task_ops.mark_started(s, wid, task, now=rig.clock.now())
    return inst.id, wid, task


def _preemption_count(rig: Rig) -> float:
    with rig.sessions() as s:
        families = snapshot_families(s, now=rig.clock.now(), spend=[], team=None)
    fam = next(f for f in families if f.name == "autoscaler_instance_preemptions")
    return sum(sample.value for sample in fam.samples if sample.name.endswith("_total"))


def test_an_agent_reported_notice_without_provider_events_ends_preempted_not_lost(rig: Rig) -> None:
    # GCP and Azure: no interruption events, only the agent's own metadata watcher.
    rig.fakes["gpu-pool"].capabilities = GCP_LIKE
    inst_id, wid, task = _running_worker(rig)
    deadline = rig.clock.now() + timedelta(seconds=30)
    with transaction(rig.sessions) as s:
        reply = worker_ops.heartbeat(
            s,
            wid,
            now=rig.clock.now(),
            running=[task],
            draining=True,
            preempted=True,
            preempt_reason="gcp instance preempted",
            preempt_deadline=deadline,
        )
    assert reply.drain and reply.drain_deadline == deadline
    w = rig.worker(wid)
    assert (w.state, w.drain_reason) == ("draining", "spot")
    assert rig.instance(inst_id).state == "draining"
    # The task checkpoints and is requeued; the agent deregisters before the VM goes.
    rig.finish(wid, task, reason="interrupted", detail="spot")
    rig.leave(wid)
    assert rig.instance(inst_id).state == "preempted"
    res = rig.reconciler().run_cycle()
    assert rig.instance(inst_id).state == "terminated"
    steps = [(a, b) for a, b, _ in _history(rig, inst_id)]
    assert ("ready", "draining") in steps and ("draining", "preempted") in steps
    assert ("ready", "lost") not in steps and ("draining", "lost") not in steps
    reasons = {b: c for _, b, c in _history(rig, inst_id)}
    assert reasons["draining"] == "spot notice from the agent: gcp instance preempted"
    assert reasons["preempted"] == "reclaimed after its spot notice from the agent: gcp instance preempted"
    # explain says so (the termination's reason carries the notice), and so do the metrics.
    assert any(f"terminate instance {inst_id}" in line and "gcp instance preempted" in line for line in _explain(rig))
    assert _preemption_count(rig) == 1
    # The requeued task gets a replacement.
    assert len(res.launched) == 1 and rig.task(task).state == "queued"


def _explain(rig: Rig) -> list[str]:
    with rig.sessions() as s:
        row = s.scalars(select(DecisionRecord).order_by(DecisionRecord.id.desc()).limit(1)).one()
        return [str(x) for x in row.reasons]


def test_a_spot_worker_that_falls_silent_is_preempted_too(rig: Rig) -> None:
    rig.fakes["gpu-pool"].capabilities = GCP_LIKE
    inst_id, wid, task = _running_worker(rig)
    with transaction(rig.sessions) as s:
        worker_ops.heartbeat(s, wid, now=rig.clock.now(), running=[task], preempted=True, preempt_reason="azure X")
    # The machine went before the agent could deregister: the heartbeat timeout ends it.
    rig.clock.advance(rig.config.reconcile.heartbeat_timeout_s + 1)
    rig.reconciler().run_cycle()
    assert rig.instance(inst_id).state == "terminated"
    assert "preempted" in [b for _, b, _ in _history(rig, inst_id)]
    assert rig.task(task).state == "queued"


def test_a_plain_worker_gone_is_still_lost(rig: Rig) -> None:
    rig.fakes["gpu-pool"].capabilities = GCP_LIKE
    inst_id, _, _ = _running_worker(rig)
    rig.clock.advance(rig.config.reconcile.heartbeat_timeout_s + 1)
    rig.reconciler().run_cycle()
    assert "lost" in [b for _, b, _ in _history(rig, inst_id)]
    assert "preempted" not in [b for _, b, _ in _history(rig, inst_id)]


def test_a_provider_interruption_event_marks_the_instance_preempted_with_its_deadline(rig: Rig) -> None:
    inst_id, wid, task = _running_worker(rig)
    fake = rig.fakes["gpu-pool"]
    pid = rig.instance(inst_id).provider_instance_id or ""
    deadline = rig.clock.now() + timedelta(minutes=2)
    fake._pending_events.append(
        InterruptionEvent(pid, "interruption", rig.clock.now(), deadline, "EC2 Spot Instance Interruption Warning")
    )
    rig.reconciler().run_cycle()
    w = rig.worker(wid)
    assert (w.state, w.drain_reason, w.drain_deadline) == ("draining", "spot", deadline)
    assert rig.instance(inst_id).state == "draining"
    assert rig.task(task).state == "running"  # the agent checkpoints it within the notice
    rig.finish(wid, task, reason="interrupted", detail="spot")
    rig.leave(wid)
    rig.reconciler().run_cycle()
    (_, _, why) = next(e for e in _history(rig, inst_id) if e[1] == "preempted")
    assert why.startswith("reclaimed after its spot notice from the provider: fake")
    assert "EC2 Spot Instance Interruption Warning" in why and deadline.isoformat() in why


def test_a_rebalance_stops_new_leases_and_replaces_without_interrupting(rig: Rig) -> None:
    inst_id, wid, task = _running_worker(rig)
    fake = rig.fakes["gpu-pool"]
    pid = rig.instance(inst_id).provider_instance_id or ""
    fake._pending_events.append(InterruptionEvent(pid, "rebalance", rig.clock.now()))
    queued = rig.enqueue()
    res = rig.reconciler().run_cycle()
    w = rig.worker(wid)
    assert (w.state, w.drain_reason) == ("draining", "rebalance")
    # Not "now": the running task is not interrupted (no deadline configured).
    assert w.drain_deadline is not None and w.drain_deadline - rig.clock.now() > timedelta(days=1)
    with transaction(rig.sessions) as s:
        reply = worker_ops.heartbeat(s, wid, now=rig.clock.now(), running=[task])
    assert reply.drain and task not in reply.cancel and not reply.reclaim
    assert rig.task(task).state == "running"
    assert rig.lease(wid) is None  # no new work on it
    assert len(res.launched) == 1  # the queued task gets a replacement
    (_, _, why) = next(e for e in _history(rig, inst_id) if e[1] == "draining")
    assert why.startswith("rebalance recommendation from fake") and "undisturbed" in why
    # The interruption that may follow brings the deadline forward and makes it a reclaim.
    deadline = rig.clock.now() + timedelta(minutes=2)
    fake._pending_events.append(InterruptionEvent(pid, "interruption", rig.clock.now(), deadline))
    rig.reconciler().run_cycle()
    w = rig.worker(wid)
    assert (w.drain_reason, w.drain_deadline) == ("spot", deadline)
    rig.finish(wid, task, reason="interrupted", detail="spot")
    rig.leave(wid)
    rig.reconciler().run_cycle()
    assert "preempted" in [b for _, b, _ in _history(rig, inst_id)]
    assert rig.task(queued).state in ("queued", "leased")


def test_a_rebalance_deadline_can_be_configured(rig: Rig) -> None:
    rig.config.reconcile.rebalance_drain_deadline_s = 600
    inst_id, wid, _ = _running_worker(rig)
    pid = rig.instance(inst_id).provider_instance_id or ""
    rig.fakes["gpu-pool"]._pending_events.append(InterruptionEvent(pid, "rebalance", rig.clock.now()))
    rig.reconciler().run_cycle()
    w = rig.worker(wid)
    assert w.drain_deadline == rig.clock.now() + timedelta(seconds=600)
    assert "interrupted after 600s" in next(e for e in _history(rig, inst_id) if e[1] == "draining")[2]
