"""The local provider starts, lists and stops real processes through the bootstrap path."""

from __future__ import annotations

import json
import os
import signal
import stat
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from providers.base import InstanceStatus, InvalidRequest, LaunchRequest, Provider
from providers.bootstrap import BootstrapSpec, render_user_data
from providers.local import LocalProvider, LocalRecord, default_offering

TOKEN = "asj_" + "t" * 43
# A stand-in agent: starts a grandchild (a "task") and sleeps. It gets the bootstrap
# path as its last argument, exactly like the real agent command line.
STUB = (
    "import subprocess, sys, time, pathlib;"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']);"
    "pathlib.Path('task.pid').write_text(str(child.pid));"
    "time.sleep(120)"
)
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)"


def stub(code: str):  # type: ignore[no-untyped-def]
    def command(bootstrap: Path) -> Sequence[str]:
        return [sys.executable, "-c", code, str(bootstrap)]

    return command


def user_data() -> str:
    return render_user_data(
        BootstrapSpec(server_url="http://127.0.0.1:9", pool="cpu", provider="local", join_token=TOKEN)
    )


def request(rid: str, owner: str = "test") -> LaunchRequest:
    return LaunchRequest(
        request_id=rid, pool="cpu", owner=owner, offering=default_offering(None), user_data=user_data()
    )


def provider(home: Path, code: str = STUB, **kw: object) -> LocalProvider:
    return LocalProvider(
        [],
        pool="cpu",
        home=home,
        command=stub(code),
        simulated_gpus={"count": 2, "model": "Sim", "memory_mb": 1024},
        labels={"site": "lab"},
        stop_grace_s=2,
        **kw,
    )  # type: ignore[arg-type]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(path: Path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return path.read_text()


@pytest.fixture
def local(tmp_path: Path):  # type: ignore[no-untyped-def]
    p = provider(tmp_path)
    yield p
    p.terminate([r.instance_id for r in p._records()])


def test_launch_writes_the_bootstrap_and_starts_a_process(local: LocalProvider) -> None:
    assert isinstance(local, Provider)
    (inst,) = local.launch(request("r1"))
    assert inst.status is InstanceStatus.RUNNING
    assert inst.tags["autoscaler-request-id"] == "r1"
    d = local.instance_dir(inst.instance_id)
    boot = d / "agent.json"
    assert stat.S_IMODE(boot.stat().st_mode) == 0o600
    data = json.loads(boot.read_text())
    assert data["join_token"] == TOKEN
    assert data["instance_id"] == inst.instance_id
    assert data["provider"] == "local"
    assert data["simulated_gpus"] == {"count": 2, "model": "Sim", "memory_mb": 1024}
    assert data["labels"] == {"site": "lab"}
    rec = LocalRecord.load(d / "instance.json")
    assert rec.pid is not None and alive(rec.pid)
    assert os.getpgid(rec.pid) == rec.pgid == rec.pid, "its own process group"
    assert [i.instance_id for i in local.list("test")] == [inst.instance_id]
    assert local.list("someone-else") == []


def test_same_request_id_starts_nothing_new(local: LocalProvider) -> None:
    first = local.launch(request("r1"))
    again = local.launch(request("r1"))
    assert [i.instance_id for i in first] == [i.instance_id for i in again]
    pids = {LocalRecord.load(local.instance_dir(i.instance_id) / "instance.json").pid for i in first + again}
    assert len(pids) == 1, "the second call started no second process"
    assert len(local.list("test")) == 1


def test_instances_survive_a_control_plane_restart(tmp_path: Path, local: LocalProvider) -> None:
    (inst,) = local.launch(request("r1"))
    restarted = provider(tmp_path)  # a new process would see exactly this: files, no children
    assert [i.instance_id for i in restarted.list("test")] == [inst.instance_id]
    assert [i.instance_id for i in restarted.launch(request("r1"))] == [inst.instance_id]
    restarted.terminate([inst.instance_id])
    assert restarted.list("test") == []
    assert local.list("test") == []


def test_terminate_stops_the_whole_process_group(local: LocalProvider) -> None:
    (inst,) = local.launch(request("r1"))
    d = local.instance_dir(inst.instance_id)
    task_pid = int(wait_for(d / "task.pid"))
    agent_pid = LocalRecord.load(d / "instance.json").pid
    assert agent_pid is not None and alive(task_pid)
    local.terminate([inst.instance_id])
    time.sleep(0.1)  # the task is the agent's child, reaped by init once killed
    assert not alive(agent_pid)
    assert not alive(task_pid), "tasks started by the agent are stopped with it"
    assert local.list("test") == []
    local.terminate([inst.instance_id, "local-never-existed"])  # already gone = success


def test_an_agent_ignoring_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    p = provider(
        tmp_path,
        STUBBORN,
    )
    p.stop_grace_s = 0.3
    (inst,) = p.launch(request("r1"))
    pid = LocalRecord.load(p.instance_dir(inst.instance_id) / "instance.json").pid
    assert pid is not None
    time.sleep(0.3)  # let it install its SIGTERM handler
    started = time.monotonic()
    p.terminate([inst.instance_id])
    assert not alive(pid)
    assert time.monotonic() - started < 3


def test_an_exited_agent_is_not_listed(tmp_path: Path) -> None:
    p = provider(tmp_path, "pass")
    (inst,) = p.launch(request("r1"))
    deadline = time.monotonic() + 10
    while p.list("test"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert (p.instance_dir(inst.instance_id) / "agent.log").exists()


def test_a_recycled_pid_is_not_mistaken_for_our_agent(tmp_path: Path, local: LocalProvider) -> None:
    (inst,) = local.launch(request("r1"))
    path = local.instance_dir(inst.instance_id) / "instance.json"
    rec = LocalRecord.load(path)
    assert rec.pid is not None
    real_pid = rec.pid
    # Point the record at a live process that is not this instance's agent (us).
    LocalRecord(**{**rec.__dict__, "pid": os.getpid(), "pgid": os.getpgid(0)}).save(path)
    assert local.list("test") == []
    LocalRecord(**{**rec.__dict__, "pid": real_pid}).save(path)
    os.kill(real_pid, signal.SIGKILL)


def test_launch_without_a_bootstrap_is_refused(local: LocalProvider) -> None:
    bad = LaunchRequest(request_id="r", pool="cpu", owner="test", offering=default_offering(None))
    with pytest.raises(InvalidRequest, match="needs user-data with a join token"):
        local.launch(bad)
    with pytest.raises(InvalidRequest, match="writes no"):
        local.launch(
            LaunchRequest(
                request_id="r",
                pool="cpu",
                owner="test",
                offering=default_offering(None),
                user_data="#cloud-config\n{}\n",
            )
        )


def test_default_offering_reports_the_simulated_gpus(local: LocalProvider) -> None:
    (offering,) = local.offerings()
    assert (offering.gpus, offering.gpu_type, offering.hourly_price) == (2, "Sim", 0.0)
