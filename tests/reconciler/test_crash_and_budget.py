"""Crashes around the launch call (no duplicate, no orphan), and a team over its hard
budget (drained by the real budgets policy)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from autoscaler.queueing import tasks as task_ops
from autoscaler.reconciler.states import InstanceState, transition
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, SpendRecord, Task
from providers.base import Capabilities, LaunchRequest, Offering, ProviderInstance
from providers.fake import FakeProvider
from tests.reconciler.harness import Rig, make_rig, policy_service


class Crash(BaseException):
    """The process dies here (not an Exception: nothing in the reconciler may catch it)."""


class CrashingProvider:
    """The fake cloud, but the control plane dies before or after the launch call."""

    def __init__(self, inner: FakeProvider, *, after_call: bool) -> None:
        self.inner = inner
        self.after_call = after_call
        self.name = inner.name
        self.capabilities = Capabilities()

    def offerings(self) -> list[Offering]:
        return self.inner.offerings()

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        if self.after_call:
            self.inner.launch(request)
        raise Crash()

    def list(self, owner: str) -> list[ProviderInstance]:
        return self.inner.list(owner)

    def terminate(self, instance_ids: Sequence[str]) -> None:
        self.inner.terminate(instance_ids)


def crash_in_a_launch(rig: Rig, *, after_call: bool) -> FakeProvider:
    """One reconcile cycle whose process dies just before or just after the gpu pool's
    launch call; returns that pool's fake cloud (what the next process finds there)."""
    fake = rig.fakes["gpu-pool"]
    crashing = rig.reconciler(
        {"gpu-pool": CrashingProvider(fake, after_call=after_call), "cpu-pool": rig.fakes["cpu-pool"]}
    )
    with pytest.raises(Crash):
        crashing.run_cycle()
    return fake


@pytest.mark.parametrize("after_call", [False, True], ids=["before-call", "after-call"])
def test_crash_around_launch_never_duplicates_nor_orphans(
    any_rig: Rig, config: AutoscalerConfig, clock: ManualClock, after_call: bool
) -> None:
    rig = any_rig
    rig.enqueue()
    fake = crash_in_a_launch(rig, after_call=after_call)
    (intent,) = rig.instances()
    assert intent.state == "launching" and intent.provider_instance_id is None
    assert len(fake.live()) == (1 if after_call else 0)

    # A new process starts with nothing in memory; well past the orphan grace period.
    clock.advance(config.reconcile.orphan_grace_s + 1)
    res = rig.reconciler().run_cycle()
    (inst,) = rig.instances()
    assert inst.id == intent.id and inst.state == "booting"
    assert len(fake.live()) == 1 and fake.live()[0].instance_id == inst.provider_instance_id
    assert res.orphans == [] and not fake.calls_of("terminate")
    assert (res.adopted == [inst.id]) == after_call


def test_team_over_hard_budget_is_drained_and_frozen(
    sqlite_sessions: sessionmaker[Session], config: AutoscalerConfig, clock: ManualClock, tmp_path: Path
) -> None:
    budgets = "  vision:\n    monthly_usd: 1000\n    kind: hard\n"
    policy = policy_service(tmp_path, budgets)
    try:
        rig = make_rig(sqlite_sessions, config, clock, policy)
        r = rig.reconciler()
        task = rig.enqueue("vision")
        r.run_cycle()
        (inst,) = rig.instances()
        wid = rig.register(rig.instance(inst.id))
        r.run_cycle()
        assert rig.lease(wid) == task
        # The month's spend so far (from earlier instances) reaches the budget.
        with transaction(rig.sessions) as s:
            start = clock.now().replace(day=1, hour=0)
            s.add(
                SpendRecord(
                    instance_id="earlier",
                    team="vision",
                    pool="gpu-pool",
                    provider="fake",
                    region=None,
                    instance_type="g.1",
                    capacity_type="on_demand",
                    start=start,
                    end=start + timedelta(hours=100),
                    hourly_price=10.0,
                    cost_usd=1000.0,
                )
            )
        rig.enqueue("vision")
        res = r.run_cycle()
        assert res.drained == [wid]
        assert rig.worker(wid).state == "draining"  # busy, and drained anyway: hard budget
        assert res.launched == []
        with rig.sessions() as s:
            from autoscaler.state.models import DecisionRecord

            row = s.get(DecisionRecord, res.decision_id)
            assert row is not None
            text = "\n".join(row.reasons)
        assert "team vision" in text and "budget" in text
        assert rig.instance(inst.id).state == "draining"
        assert isinstance(rig.instance(inst.id), Instance)
    finally:
        policy.close()


def test_crash_after_terminate_intent_of_an_unrecorded_launch_leaks_no_vm(rig: Rig) -> None:
    """The VM launched, the process died before recording it, and a later process died
    right after marking the row `terminating` (no provider id): the next sync finds the
    VM by request id, records it and terminates it (it used to live forever)."""
    fake = rig.fakes["gpu-pool"]
    task = rig.enqueue()
    crashing = rig.reconciler({"gpu-pool": CrashingProvider(fake, after_call=True), "cpu-pool": rig.fakes["cpu-pool"]})
    with pytest.raises(Crash):
        crashing.run_cycle()
    (vm,) = fake.live()
    with transaction(rig.sessions) as s:
        (intent,) = s.scalars(select(Instance)).all()
        transition(s, intent, InstanceState.TERMINATING, reason="given up (test)", now=rig.clock.now())
        row = s.get(Task, task)
        assert row is not None
        task_ops.cancel(s, row, now=rig.clock.now())
    r = rig.reconciler()
    first = r.run_cycle()
    assert fake.live() == [] and fake.instances[vm.instance_id].terminated_at is not None
    assert first.orphans == []
    row = rig.instance(intent.id)
    assert (row.state, row.provider_instance_id) == ("terminating", vm.instance_id)
    r.run_cycle()
    assert rig.instance(intent.id).state == "terminated"
