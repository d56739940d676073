"""Hybrid end to end: on-prem first, the Slurm cluster next, the cloud for the overflow,
and the cloud given back first.

What is real: the server (uvicorn on 127.0.0.1, SQLite), the `Reconciler` with the
shipped policies (embedded Rego) and the pure planner, the providers `autoscaler up`
builds (`component.build_providers`), the user-data with one-time join tokens
(`component.bootstrap_user_data`), a single-node Slurm cluster (tests/fakes/slurm.py),
and every agent: real `python -m autoscaler agent` processes with simulated GPUs:
- on-prem: started by the test, as an operator would on an on-prem machine, with a
  join token for the static pool (the machine is also declared in `options.machines`);
- Slurm: started by Slurm itself, in the batch job the reconciler submitted;
- cloud: the pool is the fake provider (it stands for a cloud and runs nothing), so the
  test boots each fake instance the way a VM would: a real agent process from the
  instance's own user-data (bootstrap file), killed if the instance is terminated.

The reconciler is stepped by the test (`run_cycle()` every 0.3 s) instead of APScheduler,
so each phase is checked between cycles. Tasks run until the test releases them.

Scale-down order: a static worker is never drained for idleness (the planner's rule: it
costs nothing to keep); between the Slurm and the cloud pool, both idle, the order comes
from their idle timeouts (1 s for the cloud, 8 s for Slurm here: capacity paid by the
hour goes first). The planner's other scale-down rule (remaining demand is counted
against the cheapest capacity, so the pricier idle worker is the surplus) is shown
deterministically in tests/reconciler/test_static_pools.py and tests/planner.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.agent.settings import agent_env_names
from autoscaler.config import AutoscalerConfig, PolicyConfig, PoolConfig, parse_config
from autoscaler.policy.service import PolicyService
from autoscaler.queueing import tasks as task_ops
from autoscaler.reconciler.component import bootstrap_user_data, build_providers
from autoscaler.reconciler.cycle import CycleResult, Reconciler
from autoscaler.state.db import make_engine, session_factory, transaction
from autoscaler.state.models import Instance, InstanceEvent, Task, Worker
from providers.bootstrap import BootstrapSpec, parse_user_data, render_user_data
from providers.fake import FakeProvider
from providers.slurm import SlurmProvider
from tests.conftest import FAST_AGENT, REPO, LiveServer, issue_token, make_context
from tests.fakes.slurm import SlurmCluster

PY = sys.executable
GPU = {"count": 1, "model": "Simulated A10G", "memory_mb": 24576}
CLOUD_IDLE_S = 1
SLURM_IDLE_S = 8


def hybrid_config(slurm_conf: Path) -> AutoscalerConfig:
    doc: dict[str, Any] = {
        "deployment": "hybrid-e2e",
        "teams": [{"name": "vision"}],
        # Listed cloud first on purpose: cost order, not list order, decides.
        "queues": [{"name": "gpu", "pools": ["cloud-gpu", "slurm-gpu", "onprem"], "priority": 10}],
        # Nothing here waits for a lost agent; 15 s over the agents' 10 s heartbeat once
        # declared the on-prem agent gone on a loaded 2-core machine (an idle agent now
        # long-polls instead of leasing every few seconds, so only heartbeats show it alive).
        "reconcile": {"heartbeat_timeout_s": 45, "orphan_grace_s": 30},
        "pools": [
            {
                "name": "onprem",
                "provider": "static",
                # Far shorter than the test: on-prem must still never be drained.
                "idle_timeout_s": 0.5,
                "instance_types": [{"name": "onprem.1gpu", "gpus": 1}],
                "options": {"machines": [{"name": "onprem-01", "gpus": 1}]},
            },
            {
                "name": "slurm-gpu",
                "provider": "slurm",
                "max_instances": 1,
                "boot_timeout_s": 30,
                "idle_timeout_s": SLURM_IDLE_S,
                "simulated_gpus": GPU,
                "instance_types": [
                    {"name": "slurm.1gpu", "gpus": 1, "cpus": 1, "memory_mb": 500, "on_demand_price": 0.0}
                ],
                "options": {
                    "slurm_conf": str(slurm_conf),
                    "agent_command": [PY, "-m", "autoscaler", "agent", *FAST_AGENT],
                },
            },
            {
                "name": "cloud-gpu",
                "provider": "fake",
                "max_instances": 4,
                "boot_timeout_s": 30,
                "idle_timeout_s": CLOUD_IDLE_S,
                "simulated_gpus": GPU,
                "instance_types": [{"name": "cloud.1gpu", "gpus": 1, "on_demand_price": 1.0, "spot_price": 0.4}],
            },
        ],
    }
    return parse_config(yaml.safe_dump(doc), Path("hybrid.yaml"))


def agent_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in agent_env_names()}
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Hybrid:
    tmp: Path
    server: LiveServer
    reconciler: Reconciler
    fake: FakeProvider
    slurm: SlurmProvider
    cluster: SlurmCluster
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    results: list[CycleResult] = field(default_factory=list)
    n: int = 0

    @property
    def sessions(self) -> Any:
        return self.server.ctx.sessions

    def start_agent(self, name: str, bootstrap: dict[str, Any]) -> None:
        path = self.tmp / f"{name}.agent.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(bootstrap, f)
        log = (self.tmp / f"{name}.log").open("wb")
        cmd = [PY, "-m", "autoscaler", "agent", "--bootstrap", str(path), "--work-dir", str(self.tmp / name)]
        self.agents[name] = subprocess.Popen(
            [*cmd, *FAST_AGENT], env=agent_env(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO
        )

    def boot_cloud_instances(self) -> None:
        """What a VM does with its user-data: run the agent; a terminated VM takes it along."""
        live = {i.instance_id: i for i in self.fake.live()}
        for iid, inst in live.items():
            if iid not in self.agents:
                self.start_agent(iid, {**parse_user_data(inst.request.user_data), "instance_id": iid})
        for iid, proc in self.agents.items():
            if iid.startswith("fake-") and iid not in live and proc.poll() is None:
                # Terminated right after its agent deregistered: let the agent finish
                # exiting (a VM's shutdown takes that long too), then power off.
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()

    def cycle(self) -> CycleResult:
        result = self.reconciler.run_cycle()
        self.results.append(result)
        self.boot_cloud_instances()
        return result

    def cycle_until(self, what: str, check: Callable[[], Any], timeout: float = 30) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.cycle()
            value = check()
            if value:
                return value
            time.sleep(0.3)
        raise AssertionError(f"timed out waiting for {what}\n{self.diagnostics()}")

    def enqueue(self) -> tuple[str, Path]:
        self.n += 1
        release = self.tmp / f"release-{self.n}"
        wait = "import os, sys, time\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"
        with transaction(self.sessions) as s:
            spec = task_ops.TaskSpec(queue="gpu", command=[PY, "-c", wait, str(release)], gpus=1)
            task_id = task_ops.enqueue(s, spec, team="vision", now=self.server.ctx.clock.now()).id
        return task_id, release

    def running_pools(self, task_ids: list[str]) -> list[str] | None:
        """The pool of each task's worker once every task runs, else None."""
        with self.sessions() as s:
            tasks = [s.get(Task, t) for t in task_ids]
            if not all(t is not None and t.state == "running" for t in tasks):
                return None
            return [self._pool_of(s, t.worker_id) for t in tasks if t is not None]

    @staticmethod
    def _pool_of(s: Session, worker_id: str | None) -> str:
        w = s.get(Worker, worker_id) if worker_id else None
        return w.pool if w else "?"

    def instances(self, pool: str) -> list[Instance]:
        with self.sessions() as s:
            return list(s.scalars(select(Instance).where(Instance.pool == pool).order_by(Instance.created_at)))

    def workers(self, pool: str) -> list[Worker]:
        with self.sessions() as s:
            return list(s.scalars(select(Worker).where(Worker.pool == pool)))

    def diagnostics(self) -> str:
        out = []
        for pool in ("onprem", "slurm-gpu", "cloud-gpu"):
            out.append(f"{pool}: instances {[(i.id[:8], i.state) for i in self.instances(pool)]}")
            out.append(f"{pool}: workers {[(w.instance_id, w.state) for w in self.workers(pool)]}")
        if self.results:
            out.append(f"last plan: {self.results[-1].plan.to_dict()}")
        for log in sorted(self.tmp.glob("*.log")) + sorted(self.slurm.settings.log_dir.glob("*.log")):
            out.append(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}")
        return "\n".join(out)


@pytest.fixture
def hybrid(
    slurm_cluster: SlurmCluster, sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Hybrid]:
    # sbatch exports this environment to the job: only the bootstrap may configure agents.
    for name in agent_env_names():
        monkeypatch.delenv(name, raising=False)
    config = hybrid_config(slurm_cluster.conf)
    engine = make_engine(sqlite_url)
    ctx = make_context(config, session_factory(engine))
    server = LiveServer(ctx).start()
    # What `autoscaler up` builds: a provider per pool (static included) and user-data
    # with a one-time join token, pointing at the server's public URL.
    providers = build_providers(config, SimpleNamespace(home=tmp_path / "home"))  # type: ignore[arg-type]
    public = config.model_copy(update={"server": config.server.model_copy(update={"public_url": server.url})})
    render = bootstrap_user_data(public, ctx.clock.now)

    def user_data(s: Session, pool: PoolConfig, request_id: str, nodes: int = 1, /) -> str:
        # The fake cloud runs nothing itself; its user-data is what a real VM of that pool
        # would get (provider "local": no cloud metadata service to poll here).
        as_vm = pool.model_copy(update={"provider": "local"}) if pool.provider == "fake" else pool
        return render(s, as_vm, request_id, nodes)

    policy = PolicyService(PolicyConfig(), isolate=False)
    reconciler = Reconciler(ctx.sessions, config, ctx.clock, providers, policy, user_data=user_data)
    fake, slurm = providers["cloud-gpu"], providers["slurm-gpu"]
    assert isinstance(fake, FakeProvider) and isinstance(slurm, SlurmProvider)
    rig = Hybrid(tmp_path, server, reconciler, fake, slurm, slurm_cluster)
    try:
        yield rig
    finally:
        for release in tmp_path.glob("release-*"):
            release.touch()
        for i in range(1, rig.n + 1):
            (tmp_path / f"release-{i}").touch()
        for proc in rig.agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in rig.agents.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        leftover = [i.instance_id for i in slurm.list(config.deployment)]
        if leftover:
            slurm.terminate(leftover)
        server.stop()
        policy.close()
        engine.dispose()


def test_onprem_first_cloud_for_overflow_cloud_given_back_first(hybrid: Hybrid) -> None:
    h = hybrid
    # The on-prem machine: its agent started by hand with a join token for the static pool.
    token = issue_token(h.server.ctx, "join", pool="onprem", ttl=timedelta(hours=1))
    spec = BootstrapSpec(
        server_url=h.server.url, pool="onprem", provider="static", join_token=token, simulated_gpus=GPU
    )
    h.start_agent("onprem-01", {**parse_user_data(render_user_data(spec)), "instance_id": "onprem-01"})
    h.cycle_until("the on-prem agent to register", lambda: h.workers("onprem"))
    # Declared in options.machines, and now running an agent: no longer reported.
    registered = len(h.results)
    assert h.cycle().static_without_agent == []

    # (a) Demand that fits on-prem: the idle on-prem machine and one Slurm job take it.
    t1, r1 = h.enqueue()
    t2, r2 = h.enqueue()
    pools = h.cycle_until("both tasks to run on-prem", lambda: h.running_pools([t1, t2]))
    assert sorted(pools) == ["onprem", "slurm-gpu"]
    assert h.fake.calls_of("launch") == [], "no cloud launch while on-prem capacity fits"
    (slurm_inst,) = h.instances("slurm-gpu")
    assert slurm_inst.state == "ready" and slurm_inst.provider == "slurm"
    assert slurm_inst.provider_instance_id is not None
    job_id = {i.instance_id: i.tags["slurm-job-id"] for i in h.slurm.list("hybrid-e2e")}[
        slurm_inst.provider_instance_id
    ]
    launched_pools = {x.pool for r in h.results for x in r.plan.launches}
    assert launched_pools == {"slurm-gpu"}

    # (b) Overflow: on-prem is full (the static pool busy, Slurm at its max of 1), so the
    # cloud launches, spot first, one instance per task, and nothing else.
    t3, r3 = h.enqueue()
    t4, r4 = h.enqueue()
    before = len(h.results)
    pools = h.cycle_until("the overflow to run in the cloud", lambda: h.running_pools([t3, t4]))
    assert pools == ["cloud-gpu", "cloud-gpu"]
    launches = [x for r in h.results[before:] for x in r.plan.launches]
    assert [(x.pool, x.offering.capacity_type) for x in launches] == [("cloud-gpu", "spot")] * 2
    assert len(h.fake.calls_of("launch")) == 2 and len(h.instances("slurm-gpu")) == 1

    # (c) Demand falls to nothing: the cloud instances are drained (their agents exit 0)
    # and terminated first; Slurm and on-prem are still there at that moment.
    for release in (r1, r2, r3, r4):
        release.touch()
    h.cycle_until(
        "all four tasks to succeed",
        lambda: all(s == "succeeded" for s in (h_state(h, t) for t in (t1, t2, t3, t4))),
    )
    before = len(h.results)
    h.cycle_until(
        "the cloud instances to be terminated",
        lambda: h.fake.live() == [] and all(i.state == "terminated" for i in h.instances("cloud-gpu")),
    )
    cloud_agents = [p for iid, p in h.agents.items() if iid.startswith("fake-")]
    assert [p.wait(timeout=5) for p in cloud_agents] == [0, 0], "cloud agents drained and exited 0"
    assert [w.gone_reason for w in h.workers("cloud-gpu")] == ["deregistered"] * 2
    assert h.instances("slurm-gpu")[0].state == "ready", "Slurm capacity outlives the cloud's"
    assert [w.state for w in h.workers("onprem")] == ["idle"]
    assert all(x.pool == "cloud-gpu" for r in h.results[before:] for x in r.plan.drains)

    # Then the Slurm agent, idle past its own timeout, is drained: it deregisters and
    # exits, ending its job, and only then is the instance terminated (scancel for good
    # measure; the job's exit status 0 is checked in tests/providers_cloud/test_slurm_agent.py).
    h.cycle_until("the Slurm instance to be terminated", lambda: h.instances("slurm-gpu")[0].state == "terminated")
    assert [w.gone_reason for w in h.workers("slurm-gpu")] == ["deregistered"]
    with h.sessions() as s:
        events = [
            (e.to_state, e.reason)
            for e in s.scalars(
                select(InstanceEvent).where(InstanceEvent.instance_id == slurm_inst.id).order_by(InstanceEvent.id)
            )
        ]
    assert [state for state, _ in events] == [
        "requested",
        "launching",
        "booting",
        "ready",
        "draining",
        "terminating",
        "terminated",
    ]
    assert "idle for" in events[4][1] and events[5][1] == "worker drained"
    h.cycle_until("the Slurm job to be gone", lambda: h.slurm.list("hybrid-e2e") == [], timeout=15)
    assert job_id not in h.cluster.run("squeue", "--noheader", "--format=%i").split()

    # On-prem stays: never drained (its idle timeout long past), never an instance row.
    for _ in range(3):
        h.cycle()
        time.sleep(0.2)
    assert [w.state for w in h.workers("onprem")] == ["idle"]
    assert h.instances("onprem") == []
    assert all(d.pool != "onprem" for r in h.results for d in r.plan.drains)
    assert all(not r.orphans and r.static_without_agent == [] for r in h.results[registered:])
    assert h.agents["onprem-01"].poll() is None


def h_state(h: Hybrid, task_id: str) -> str:
    with h.sessions() as s:
        t = s.get(Task, task_id)
        return t.state if t else "?"
