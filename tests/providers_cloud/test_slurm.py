"""The Slurm provider against a real single-node cluster (slurmctld, slurmd, munge).

Gangs: the test cluster has ONE node (2 GPUs), so a 2-node gang can only be refused
here; that refusal is tested, and the gang machinery (one job, an srun step, per-rank
bootstrap files and instance ids, SIGTERM through srun, terminating a rank cancels the
job) is tested with a 1-node gang. A 2-node run needs a cluster with two nodes.

The job here runs a stand-in agent (a few lines of Python) so each behaviour is seen
directly: what it received, and that scancel reached it as SIGTERM through the job
script. The real agent runs in a Slurm job in tests/hybrid.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from providers.base import TAG_GANG, CapacityError, InstanceStatus, InvalidRequest, LaunchRequest, Offering
from providers.bootstrap import BootstrapSpec, render_user_data
from providers.slurm import SlurmProvider, SlurmSettings
from tests.fakes.slurm import SlurmCluster

ONE_GPU = Offering("slurm.1gpu", "on_demand", None, 1, "Simulated", 1, 500, 0.0)
TWO_GPU = Offering("slurm.2gpu", "on_demand", None, 2, "Simulated", 1, 500, 0.0)

STAND_IN_AGENT = """
import json, os, signal, sys, time
bootstrap = json.load(open(sys.argv[sys.argv.index("--bootstrap") + 1]))
out = os.path.join(os.environ["STANDIN_OUT"], bootstrap["instance_id"])
def drained(*_):
    open(out + ".drained", "w").write("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, drained)
open(out + ".started", "w").write(json.dumps({"bootstrap": bootstrap,
    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES"), "cwd": os.getcwd()}))
while True:
    time.sleep(0.1)
"""


def user_data(pool: str = "slurm-gpu") -> str:
    return render_user_data(
        BootstrapSpec(server_url="http://127.0.0.1:9", pool=pool, provider="slurm", join_token="asj_x")
    )


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    agent = tmp_path / "standin_agent.py"
    agent.write_text(STAND_IN_AGENT)
    out = tmp_path / "out"
    out.mkdir()

    def make(boot_timeout_s: float = 600, **options: Any) -> SlurmProvider:
        settings = SlurmSettings.from_options(
            {"slurm_conf": str(slurm_cluster.conf), "agent_command": [sys.executable, str(agent)], **options},
            home=tmp_path,
            pool="slurm-gpu",
            boot_timeout_s=boot_timeout_s,
        )
        return SlurmProvider(settings, [ONE_GPU, TWO_GPU])

    monkeypatch.setenv("STANDIN_OUT", str(out))  # sbatch exports the submitter's environment
    made: list[SlurmProvider] = []

    def factory(**kw: Any) -> SlurmProvider:
        made.append(make(**kw))
        return made[-1]

    factory.out = out  # type: ignore[attr-defined]
    yield factory
    slurm_cluster.run("scancel", f"--user={getpass.getuser()}")


def wait_until(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


OWNER = "test"


@pytest.fixture(autouse=True)
def _own_owner(request: pytest.FixtureRequest) -> None:
    # Jobs of an earlier test may still be completing after its scancel: each test
    # lists only its own owner tag, as deployments sharing a cluster do.
    global OWNER
    OWNER = "t-" + request.node.name.split("[")[0][-30:]


def request(request_id: str, offering: Offering = ONE_GPU, owner: str = "") -> LaunchRequest:
    return LaunchRequest(request_id, "slurm-gpu", owner or OWNER, offering, user_data=user_data())


def test_launch_submits_a_gpu_job_that_runs_the_agent_with_its_bootstrap(
    slurm: Any, slurm_cluster: SlurmCluster
) -> None:
    provider = slurm()
    [inst] = provider.launch(request("Req-S1"))
    job_id = inst.tags["slurm-job-id"]
    shown = slurm_cluster.run("scontrol", "show", "job", job_id)
    assert f"JobName={inst.instance_id}" in shown
    assert f"Comment=autoscaler-owner={OWNER};autoscaler-pool=slurm-gpu;autoscaler-request-id=Req-S1" in shown
    assert "gres/gpu=1" in shown or "gres:gpu:1" in shown
    assert f"StdOut={provider.settings.log_dir}/{inst.instance_id}-{job_id}.log" in shown

    started = slurm.out / f"{inst.instance_id}.started"
    wait_until(started.exists, "the job to start the agent")
    seen = json.loads(started.read_text())
    assert seen["bootstrap"]["instance_id"] == inst.instance_id and seen["bootstrap"]["join_token"] == "asj_x"
    assert seen["gpus"] is not None  # Slurm bound a GPU
    assert seen["cwd"] == str(provider.settings.work_dir)
    agent_file = provider.settings.state_dir / f"{inst.instance_id}.agent.json"
    assert stat.S_IMODE(agent_file.stat().st_mode) == 0o600  # one-time join token inside

    [listed] = provider.list(OWNER)
    assert (listed.instance_id, listed.request_id, listed.pool, listed.status) == (
        inst.instance_id,
        "Req-S1",
        "slurm-gpu",
        InstanceStatus.RUNNING,
    )
    assert provider.list("someone-else") == []


def test_same_request_id_submits_once(slurm: Any, slurm_cluster: SlurmCluster) -> None:
    provider = slurm()
    first = provider.launch(request("idem-s"))
    again = provider.launch(request("idem-s"))
    assert [i.tags["slurm-job-id"] for i in first] == [i.tags["slurm-job-id"] for i in again]
    # Crash between sbatch and the record: the queued job is found by name.
    (provider.settings.state_dir / f"{first[0].instance_id}.json").unlink()
    third = provider.launch(request("idem-s"))
    assert [i.tags["slurm-job-id"] for i in third] == [i.tags["slurm-job-id"] for i in first]
    names = slurm_cluster.run("squeue", "--noheader", "--format=%j").split()
    assert sorted(n for n in names if n.startswith(provider.instance_id("idem-s", 0)[:-1])) == sorted(
        i.instance_id for i in first
    )


def test_scancel_reaches_the_agent_as_sigterm_and_gone_is_success(slurm: Any) -> None:
    provider = slurm()
    [inst] = provider.launch(request("drain-s"))
    wait_until((slurm.out / f"{inst.instance_id}.started").exists, "the agent to start")
    provider.terminate([inst.instance_id])
    wait_until((slurm.out / f"{inst.instance_id}.drained").exists, "the agent to get SIGTERM")
    wait_until(lambda: provider.list(OWNER) == [], "the job to end")
    provider.terminate([inst.instance_id])  # already gone


def test_a_job_pending_past_the_boot_timeout_is_cancelled(slurm: Any, slurm_cluster: SlurmCluster) -> None:
    provider = slurm(boot_timeout_s=1.0)
    [big] = provider.launch(request("fill-node", TWO_GPU))  # both GPUs taken
    wait_until(lambda: [i.status for i in provider.list(OWNER)] == [InstanceStatus.RUNNING], "the 2-GPU job")
    [waiting] = provider.launch(request("no-room", ONE_GPU))
    statuses = {i.instance_id: i.status for i in provider.list(OWNER)}
    assert statuses[waiting.instance_id] == InstanceStatus.PENDING
    time.sleep(1.2)
    assert [i.instance_id for i in provider.list(OWNER)] == [big.instance_id]
    assert waiting.tags["slurm-job-id"] not in slurm_cluster.run("squeue", "--noheader", "--states=PENDING")


def test_sbatch_refusals_are_typed(slurm: Any) -> None:
    with pytest.raises(InvalidRequest, match="Invalid partition"):
        slurm(partition="nope").launch(request("bad-part"))
    five = Offering("slurm.5gpu", "on_demand", None, 5, "Simulated", 1, 500, 0.0)
    with pytest.raises(CapacityError) as info:
        slurm().launch(request("too-big", five))
    assert "sbatch failed" in info.value.message


def test_bad_bootstrap_and_options_are_one_line_errors(slurm: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="user-data"):
        slurm().launch(LaunchRequest("no-bootstrap", "slurm-gpu", OWNER, ONE_GPU, user_data="not: cloud-init"))
    with pytest.raises(InvalidRequest, match=r"options.partiton: unknown option; did you mean 'partition'\?"):
        SlurmSettings.from_options({"partiton": "gpu"}, home=tmp_path, pool="p", boot_timeout_s=1)


# ---- gangs ----------------------------------------------------------------------


def gang(rid: str, nodes: int, gang_id: str = "g-slurm") -> LaunchRequest:
    return dataclasses.replace(request(rid, ONE_GPU), nodes=nodes, gang=gang_id)


def jobs(cluster: SlurmCluster) -> list[str]:
    return cluster.run("squeue", "--noheader", "--format=%j").split()


def test_a_gang_wider_than_the_partition_is_refused_before_sbatch(slurm: Any, slurm_cluster: SlurmCluster) -> None:
    provider = slurm()
    with pytest.raises(InvalidRequest, match=r"the default partition has 1 node\(s\), a gang of 2 nodes x 1 GPU"):
        provider.launch(gang("wide-2", 2))
    assert not any(n.startswith(provider.instance_id("wide-2", 0)) for n in jobs(slurm_cluster))
    assert provider.list(OWNER) == []
    with pytest.raises(InvalidRequest, match="partition 'debug' has 1 node"):
        slurm(partition="debug").launch(gang("wide-2b", 2))


def test_max_gang_nodes_is_the_capability_and_a_refusal(slurm: Any) -> None:
    assert slurm().capabilities.max_gang_nodes is None
    provider = slurm(max_gang_nodes=1)
    assert provider.capabilities.max_gang_nodes == 1
    with pytest.raises(InvalidRequest, match=r"at most 1 node\(s\) \(options.max_gang_nodes\); this gang needs 3"):
        provider.launch(gang("wide-3", 3))


def test_a_one_node_gang_is_one_job_with_an_srun_step(slurm: Any, slurm_cluster: SlurmCluster) -> None:
    provider = slurm()
    [inst] = provider.launch(gang("gang-1", 1))
    job_name = provider.instance_id("gang-1", 0)
    assert inst.instance_id == f"{job_name}-r0" and inst.request_id == "gang-1"
    assert inst.tags[TAG_GANG] == "g-slurm"
    shown = slurm_cluster.run("scontrol", "show", "job", inst.tags["slurm-job-id"])
    assert f"JobName={job_name}" in shown and "NumNodes=1" in shown
    assert "autoscaler-nodes=1;autoscaler-gang=g-slurm" in shown
    started = slurm.out / f"{inst.instance_id}.started"
    wait_until(started.exists, "the rank's agent to start in the srun step")
    seen = json.loads(started.read_text())
    assert seen["bootstrap"]["instance_id"] == inst.instance_id, "each rank has its own bootstrap"
    assert seen["gpus"] is not None, "the step got the node's GPUs (--gres on srun)"
    steps = slurm_cluster.run("squeue", "--steps", "--noheader", "--format=%i", f"--jobs={inst.tags['slurm-job-id']}")
    assert f"{inst.tags['slurm-job-id']}.0" in steps.split(), "the agent runs in step 0, not in the batch shell"
    [listed] = provider.list(OWNER)
    assert (listed.instance_id, listed.status, listed.tags[TAG_GANG]) == (
        inst.instance_id,
        InstanceStatus.RUNNING,
        "g-slurm",
    )
    # Idempotent: the same request again submits nothing.
    assert [i.instance_id for i in provider.launch(gang("gang-1", 1))] == [inst.instance_id]
    assert jobs(slurm_cluster).count(job_name) == 1
    # Terminating a rank cancels the whole job; SIGTERM reaches the agent through srun.
    provider.terminate([inst.instance_id])
    wait_until((slurm.out / f"{inst.instance_id}.drained").exists, "the rank's agent to get SIGTERM")
    wait_until(lambda: provider.list(OWNER) == [], "the gang job to end")
    provider.terminate([inst.instance_id])  # already gone: success


def test_gang_argv_asks_for_n_nodes_one_task_each(slurm: Any) -> None:
    """What a 4-node gang would submit (the test cluster cannot run it): the sbatch
    flags and the step's script."""
    provider = slurm(max_gang_nodes=8)
    argv = provider._sbatch_argv(gang("argv-4", 4), "as-job", nodes=4, extra_comment={})
    assert {"--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--gres=gpu:1"} <= set(argv)
