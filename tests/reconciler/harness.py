"""A reconciler wired to the fake provider, a manual clock and the real embedded policy
engine (in-process), plus the agent-side moves (register, lease, finish, leave) done
through the real queueing functions."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.auth.tokens import create_token
from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, PolicyConfig
from autoscaler.policy.bundle import shipped_policy_dir
from autoscaler.policy.schema import PolicyEngine
from autoscaler.policy.service import PolicyService
from autoscaler.provisioning import catalog_offerings
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing import workers as worker_ops
from autoscaler.queueing.queues import sync_from_config
from autoscaler.reconciler.cycle import Reconciler
from autoscaler.state.db import transaction
from autoscaler.state.models import ApiToken, Instance, Task, Worker
from providers.base import Provider
from providers.fake import FakeProvider


def policy_service(tmp: Path | None = None, extra_budgets: str = "") -> PolicyService:
    """The shipped policies; with `extra_budgets`, a copy whose budgets.yaml has more teams."""
    if not extra_budgets:
        return PolicyService(PolicyConfig(), isolate=False)
    assert tmp is not None
    target = tmp / "policies"
    shutil.copytree(shipped_policy_dir(), target)
    budgets = target / "data" / "budgets.yaml"
    # The shipped file names no team (`teams: {}`): the extra entries go under `teams:`.
    budgets.write_text(budgets.read_text().replace("teams: {}", "teams:") + extra_budgets)
    return PolicyService(PolicyConfig(dir=str(target)), isolate=False)


@dataclass
class Rig:
    sessions: sessionmaker[Session]
    config: AutoscalerConfig
    clock: ManualClock
    fakes: dict[str, FakeProvider]
    policy: PolicyEngine

    def reconciler(self, providers: dict[str, Provider] | None = None) -> Reconciler:
        """A fresh reconciler (a restarted process: nothing kept in memory)."""
        return Reconciler(self.sessions, self.config, self.clock, providers or dict(self.fakes), self.policy)

    def enqueue(self, team: str = "vision", gpus: int = 1, queue: str = "gpu") -> str:
        with transaction(self.sessions) as s:
            spec = task_ops.TaskSpec(queue=queue, command=["python", "-c", "print(42)"], gpus=gpus)
            return task_ops.enqueue(s, spec, team=team, now=self.clock.now()).id

    def instances(self) -> list[Instance]:
        with self.sessions() as s:
            return list(s.scalars(select(Instance).order_by(Instance.created_at, Instance.id)))

    def instance(self, inst_id: str) -> Instance:
        with self.sessions() as s:
            inst = s.get(Instance, inst_id)
            assert inst is not None
            return inst

    def register(self, inst: Instance, gpus: int = 1) -> str:
        """The agent on `inst` joins with a one-time join token."""
        assert inst.provider_instance_id
        with transaction(self.sessions) as s:
            _, join = create_token(s, kind="join", now=self.clock.now(), pool=inst.pool)
            reg = worker_ops.Registration(
                hostname="h",
                instance_id=inst.provider_instance_id,
                provider="fake",
                pool=inst.pool,
                gpus=[{"index": i, "model": "A10G"} for i in range(gpus)],
            )
            worker, _ = worker_ops.register(s, join, reg, now=self.clock.now())
            return worker.id

    def lease(self, worker_id: str) -> str | None:
        with transaction(self.sessions) as s:
            task = task_ops.lease(s, worker_id, now=self.clock.now())
            return task.id if task else None

    def finish(self, worker_id: str, task_id: str, reason: str = "exit", detail: str = "") -> None:
        with transaction(self.sessions) as s:
            task_ops.mark_started(s, worker_id, task_id, now=self.clock.now())
            task_ops.finish(s, worker_id, task_id, now=self.clock.now(), reason=reason, exit_code=0, detail=detail)

    def leave(self, worker_id: str) -> None:
        """The agent exits after its drain."""
        with transaction(self.sessions) as s:
            worker_ops.deregister(s, worker_id, now=self.clock.now(), reason="drained")

    def heartbeat(self, worker_id: str) -> None:
        with transaction(self.sessions) as s:
            worker_ops.heartbeat(s, worker_id, now=self.clock.now())

    def worker(self, worker_id: str) -> Worker:
        with self.sessions() as s:
            w = s.get(Worker, worker_id)
            assert w is not None
            return w

    def task(self, task_id: str) -> Task:
        with self.sessions() as s:
            t = s.get(Task, task_id)
            assert t is not None
            return t


def make_rig(
    sessions: sessionmaker[Session], config: AutoscalerConfig, clock: ManualClock, policy: PolicyEngine
) -> Rig:
    with transaction(sessions) as s:
        sync_from_config(s, config, now=clock.now())
    fakes = {
        p.name: FakeProvider(catalog_offerings(p), name=f"fake:{p.name}", clock=clock.now)
        for p in config.pools
        if p.provider == "fake"
    }
    return Rig(sessions, config, clock, fakes, policy)


__all__ = ["ApiToken", "Rig", "make_rig", "policy_service"]
