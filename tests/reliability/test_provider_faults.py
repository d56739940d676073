"""Provider faults through the real reconcile loop: the AWS driver (real boto3) against
moto over HTTP answers RunInstances with capacity, quota, throttling and 5xx errors
for as long as the fault is armed. The loop must keep cycling (a decision recorded
every cycle, nothing raised), back off instead of hammering the API, launch nothing
while the fault lasts, and converge to the wanted fleet once it clears."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, PolicyConfig
from autoscaler.policy.service import PolicyService
from autoscaler.provisioning import build_provider
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing.queues import sync_from_config
from autoscaler.reconciler.cycle import Reconciler
from autoscaler.state.db import make_engine, session_factory, transaction, upgrade
from autoscaler.state.models import DecisionRecord, Instance
from tests.fakes.aws import MotoEC2, unique_owner
from tests.reliability.controlplane import aws_config

FAULTS = [
    ("InsufficientInstanceCapacity", 400),  # capacity
    ("InstanceLimitExceeded", 400),  # quota
    ("RequestLimitExceeded", 503),  # throttling
    ("InternalError", 500),  # a 5xx
    ("Unavailable", 503),  # service unavailable
]
WANTED = 2
FAULT_CYCLES = 12
STEP_S = 5.0


@pytest.fixture(scope="module")
def policy() -> Any:
    return PolicyService(PolicyConfig(), isolate=False)


@pytest.mark.parametrize("code,status", FAULTS, ids=[c for c, _ in FAULTS])
def test_loop_backs_off_and_converges(
    tmp_path: Path,
    moto_ec2: MotoEC2,
    policy: Any,
    code: str,
    status: int,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    owner = unique_owner("fault")
    raw = aws_config(moto_ec2.url, owner, 0, f"sqlite:///{tmp_path / 'a.db'}", unavailable_ttl_s=30)
    raw["pools"][0]["boot_timeout_s"] = 3600  # instances stay while we count them
    config = AutoscalerConfig.model_validate(raw)
    engine = make_engine(config.database_url or "")
    upgrade(engine)
    sessions = session_factory(engine)
    with transaction(sessions) as s:
        sync_from_config(s, config, now=clock.now())
        for i in range(WANTED):
            task_ops.enqueue(
                s, task_ops.TaskSpec(queue="gpu", command=["t", str(i)], gpus=1), team="vision", now=clock.now()
            )
    pool = config.pools[0]
    provider = build_provider(pool, deployment=owner, home=tmp_path)
    rec = Reconciler(sessions, config, clock, {pool.name: provider}, policy)

    def count(model: Any, *where: Any) -> int:
        with sessions() as s:
            return int(s.scalar(select(func.count()).select_from(model).where(*where)) or 0)

    moto_ec2.arm("RunInstances", code, status=status, times=None)
    for _ in range(FAULT_CYCLES):
        rec.run_cycle()  # must not raise
        clock.advance(STEP_S)
    attempts = len(moto_ec2.calls("RunInstances"))
    assert count(DecisionRecord) == FAULT_CYCLES, "a cycle went unrecorded"
    assert count(Instance, Instance.provider_instance_id.is_not(None)) == 0
    assert 1 <= attempts < FAULT_CYCLES * WANTED, f"{attempts} launch calls in {FAULT_CYCLES} cycles: no backoff"
    errors = [r.last_error for r in _instances(sessions) if r.last_error]
    assert errors and all(code in e for e in errors), errors

    moto_ec2.clear()  # the fault clears
    for _ in range(30):
        rec.run_cycle()
        clock.advance(STEP_S)
        if count(Instance, Instance.state.in_(("booting", "ready"))) >= WANTED:
            break
    booting = count(Instance, Instance.state.in_(("booting", "ready")))
    assert booting == WANTED, f"did not converge: {booting} instances up, wanted {WANTED}"
    live = moto_ec2.client().describe_instances(
        Filters=[
            {"Name": "tag:autoscaler-owner", "Values": [owner]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )
    assert sum(len(r["Instances"]) for r in live["Reservations"]) == WANTED  # no duplicate from retries
    engine.dispose()


def _instances(sessions: Any) -> list[Instance]:
    with sessions() as s:
        return list(s.scalars(select(Instance)))
