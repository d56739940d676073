"""The real agent inside a Slurm job: `SlurmProvider.launch` submits the job script that
runs `python -m autoscaler agent --bootstrap FILE`; the agent registers with the live
server (127.0.0.1: the single-node cluster runs the job on this machine), runs a task,
and on scale-down drains and exits 0, which ends the job; `scancel` then finds nothing
left to cancel. Real Slurm (tests/fakes/slurm.py), real agent, real server.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from autoscaler.agent.settings import agent_env_names
from autoscaler.api.context import AppContext
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing.workers import drain
from autoscaler.state.db import transaction
from autoscaler.state.models import Task, Worker
from providers.base import LaunchRequest, Offering
from providers.bootstrap import BootstrapSpec, render_user_data
from providers.slurm import SlurmProvider, SlurmSettings
from tests.conftest import FAST_AGENT, LiveServer, issue_token
from tests.fakes.slurm import SlurmCluster
from tests.waiting import wait_for

ONE_GPU = Offering("slurm.1gpu", "on_demand", None, 1, "Simulated", 1, 500, 0.0)
OWNER = "slurm-agent-test"


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30, on_fail: Callable[[], str] = str) -> Any:
    return wait_for(what, check, timeout, every=0.1, describe=on_fail)


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    # A process-level test of seconds: SQLite only (the queueing is covered on both backends).
    return sqlite_url


@pytest.fixture
def provider(slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmProvider]:
    # sbatch exports the submitter's environment to the job: only the bootstrap file
    # may configure the agent there.
    for name in agent_env_names():
        monkeypatch.delenv(name, raising=False)
    settings = SlurmSettings.from_options(
        {
            "slurm_conf": str(slurm_cluster.conf),
            "agent_command": [sys.executable, "-m", "autoscaler", "agent", *FAST_AGENT],
        },
        home=tmp_path,
        pool="gpu-pool",
        boot_timeout_s=60,
    )
    made = SlurmProvider(settings, [ONE_GPU])
    yield made
    ids = [i.instance_id for i in made.list(OWNER)]
    if ids:
        made.terminate(ids)
    # Nothing of ours may stay on the shared cluster for the next test.
    wait_until("our jobs to end", lambda: made.list(OWNER) == [], timeout=15)


def test_real_agent_in_a_slurm_job_registers_runs_a_task_and_drains(
    provider: SlurmProvider, slurm_cluster: SlurmCluster, live_server: LiveServer, ctx: AppContext
) -> None:
    token = issue_token(ctx, "join", pool="gpu-pool", ttl=timedelta(minutes=10))
    user_data = render_user_data(
        BootstrapSpec(
            server_url=live_server.url,
            pool="gpu-pool",
            provider="slurm",
            join_token=token,
            simulated_gpus={"count": 1, "model": "Simulated A10G", "memory_mb": 24576},
        )
    )
    [inst] = provider.launch(LaunchRequest("slurm-agent-1", "gpu-pool", OWNER, ONE_GPU, user_data=user_data))
    job_id = inst.tags["slurm-job-id"]
    log = provider.settings.log_dir / f"{inst.instance_id}-{job_id}.log"

    def agent_log() -> str:
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no job log yet)"
        return f"job log:\n{tail}\nslurmctld:\n{slurm_cluster.log_tail()}"

    def worker() -> Worker | None:
        with ctx.sessions() as s:
            return s.scalar(select(Worker).where(Worker.instance_id == inst.instance_id))

    w = wait_until("the agent in the Slurm job to register", worker, on_fail=agent_log)
    assert (w.pool, w.provider, w.gpu_count, w.simulated_gpus) == ("gpu-pool", "slurm", 1, True)

    with transaction(ctx.sessions) as s:
        spec = task_ops.TaskSpec(queue="gpu", command=[sys.executable, "-c", "print('ran in slurm')"], gpus=1)
        task_id = task_ops.enqueue(s, spec, team="vision", now=ctx.clock.now()).id

    def task_done() -> Task | None:
        with ctx.sessions() as s:
            t = s.get(Task, task_id)
            return t if t is not None and t.state in ("succeeded", "failed") else None

    done = wait_until("the task to finish on the Slurm agent", task_done, on_fail=agent_log)
    assert (done.state, done.worker_id) == ("succeeded", w.id)

    # Scale-down as the reconciler does it: drain the worker (idle-only), the agent
    # deregisters and exits 0, which ends the job; then scancel, which must be harmless.
    with transaction(ctx.sessions) as s:
        drain(s, w.id, now=ctx.clock.now(), deadline_s=5, reason="idle", only_if_idle=True)
    wait_until("the job to end after the drain", lambda: provider.list(OWNER) == [], on_fail=agent_log)
    gone = worker()
    assert gone is not None and gone.state == "gone" and gone.gone_reason == "deregistered"
    provider.terminate([inst.instance_id])
    # The job ended by itself with the agent's exit status 0: COMPLETED, not CANCELLED.
    jobcomp = slurm_cluster.root / "log" / "jobcomp.txt"
    line = wait_until(
        "the job's completion record",
        lambda: next((x for x in jobcomp.read_text().splitlines() if f"JobId={job_id} " in x), None),
        timeout=10,
    )
    assert "JobState=COMPLETED" in line and "ExitCode=0:0" in line, line
    assert "drain" in log.read_text(errors="replace").lower()
