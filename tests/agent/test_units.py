"""In-process tests of the agent's parts: bootstrap, decisions, NVML discovery (fake
`pynvml`), metadata clients (fake services), the wire contract with the server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest

from autoscaler.agent import gpus as gpu_mod
from autoscaler.agent.decisions import (
    StopRequest,
    backoff_s,
    cut_uploads,
    finish_report,
    gpu_env,
    preempt_grace_s,
    preempt_margin_s,
)
from autoscaler.agent.errors import AgentError
from autoscaler.agent.join_secret import fetch_join_token
from autoscaler.agent.metadata import metadata_service, parse_iso, parse_rfc1123
from autoscaler.agent.outbox import Outbox
from autoscaler.agent.server_api import ServerApi, ServerUnreachable
from autoscaler.agent.settings import (
    SimulatedGpuSpec,
    Timing,
    TokenRef,
    read_bootstrap,
    resolve,
    task_base_env,
)
from autoscaler.agent.wire import FinishBody, HeartbeatBody, LogChunk, RegisterBody
from autoscaler.api import schemas
from tests.agent.conftest import PY
from tests.conftest import REPO
from tests.fakes import nvml
from tests.fakes.metadata import FakeMetadata

# -- bootstrap ------------------------------------------------------------------------


def _write(tmp_path: Path, data: Any, mode: int = 0o600) -> Path:
    path = tmp_path / "agent.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    path.chmod(mode)
    return path


def test_flags_win_over_env_which_wins_over_the_bootstrap_file(tmp_path: Path) -> None:
    boot = _write(
        tmp_path,
        {
            "server_url": "http://file:1",
            "pool": "file-pool",
            "provider": "aws",
            "join_token_ref": {"kind": "aws-ssm", "name": "/autoscaler/join"},
            "instance_id": "i-file",
            "labels": {"a": "b"},
        },
    )
    env = {"AUTOSCALER_POOL": "env-pool", "AUTOSCALER_JOIN_TOKEN": "asj_env"}
    s = resolve({"server_url": "http://flag:2/"}, env, boot, Timing())
    assert (s.server_url, s.pool, s.provider, s.join_token, s.instance_id) == (
        "http://flag:2",
        "env-pool",
        "aws",
        "asj_env",
        "i-file",
    )
    assert s.join_token_ref == TokenRef(kind="aws-ssm", name="/autoscaler/join") and s.labels == {"a": "b"}
    assert s.warnings == ()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON (line 1"),
        ("[1]", "must hold a JSON object"),
        ({"server_url": "http://x", "pool": "p", "provider": "moon"}, "provider: Input should be"),
        ({"server_url": "http://x", "pool": "p", "simulated_gpus": {"count": -1}}, "simulated_gpus.count"),
        # The hint named `token create --kind join`, an option the CLI does not have.
        ({"server_url": "http://x", "pool": "p"}, "no join token: pass --join-token"),
        ({"server_url": "http://x", "pool": "p"}, "(create one with `autoscaler token create --join --pool POOL`)"),
        ({"pool": "p", "join_token": "asj_x"}, "missing --server"),
        ({"server_url": "ftp://x", "pool": "p", "join_token": "asj_x"}, "must start with http"),
    ],
)
def test_bad_bootstrap_gives_one_clear_line(tmp_path: Path, content: Any, message: str) -> None:
    with pytest.raises(AgentError) as err:
        # A state dir of its own: a saved worker record elsewhere would stand in for the join token.
        resolve({}, {"AUTOSCALER_STATE_DIR": str(tmp_path / "state")}, _write(tmp_path, content), Timing())
    assert message in err.value.message and "\n" not in err.value.message


def test_missing_bootstrap_file_and_world_readable_token_are_reported(tmp_path: Path) -> None:
    with pytest.raises(AgentError, match="does not exist"):
        read_bootstrap(tmp_path / "nope.json")
    _, unknown, warnings = read_bootstrap(_write(tmp_path, {"join_token": "asj_x", "extra_key": 1}, mode=0o644))
    assert unknown == ("extra_key",) and "chmod 600" in warnings[0]


def test_tasks_never_see_the_agents_configuration() -> None:
    env = task_base_env({"PATH": "/bin", "AUTOSCALER_JOIN_TOKEN": "asj_secret", "AUTOSCALER_SERVER": "x"})
    assert env == {"PATH": "/bin"}


def test_join_token_ref_without_the_sdk_or_backend_names_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)  # import boto3 -> ImportError
    with pytest.raises(Exception, match=r"gpu-autoscaler\[aws\]"):
        fetch_join_token(TokenRef(kind="aws-ssm", name="/join"))
    with pytest.raises(AgentError, match="not supported by this agent build yet"):
        fetch_join_token(TokenRef(kind="gcp-secret", name="projects/p/secrets/join"))


# -- decisions ------------------------------------------------------------------------


def test_finish_reports_say_why_an_attempt_ended() -> None:
    assert finish_report(None, 0) == FinishBody(reason="exit", exit_code=0)
    assert finish_report(None, 3) == FinishBody(reason="exit", exit_code=3)
    assert finish_report(None, -9) == FinishBody(reason="exit", exit_code=-9, detail="killed by SIGKILL")
    # Stopped by the agent for a drain or a spot notice: interrupted even after a clean exit.
    assert finish_report(StopRequest("spot"), 0) == FinishBody(reason="interrupted", exit_code=0, detail="spot")
    assert finish_report(StopRequest("drain"), -15).reason == "interrupted"
    assert finish_report(StopRequest("timeout", "timeout after 5s"), -15) == FinishBody(
        reason="timeout", exit_code=-15, detail="timeout after 5s; killed by SIGTERM"
    )
    assert finish_report(StopRequest("canceled"), -9).reason == "canceled"
    assert finish_report(None, 300).exit_code == 255


def test_backoff_grows_to_the_cap_and_jitter_only_shortens() -> None:
    delays = [backoff_s(n, base_s=0.5, cap_s=4) for n in range(6)]
    assert delays == [0, 0.5, 1, 2, 4, 4]
    assert backoff_s(3, base_s=0.5, cap_s=4, jitter=0.99) == pytest.approx(2 * (1 - 0.495))


def test_output_is_merged_per_stream_and_cut_under_the_request_limit() -> None:
    chunks = [
        LogChunk(stream="stdout", data="ab"),
        LogChunk(stream="stdout", data="cdefg"),
        LogChunk(stream="stderr", data="xyz"),
    ]
    uploads = cut_uploads(chunks, 4)
    assert [[(c.stream, c.data) for c in u] for u in uploads] == [
        [("stdout", "abcd")],
        [("stdout", "efg"), ("stderr", "x")],
        [("stderr", "yz")],
    ]
    assert all(sum(len(c.data) for c in u) <= 4 for u in uploads)


def test_gpu_env_pins_pci_order_and_hides_gpus_from_cpu_tasks() -> None:
    assert gpu_env([2, 3]) == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert gpu_env([])["CUDA_VISIBLE_DEVICES"] == ""


# -- NVML through the fake --------------------------------------------------------------


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # Whatever `pynvml` was before (real module or none), it is back after the test.
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    yield


def test_nvml_inventory_and_metrics(fake_nvml: None) -> None:
    nvml.install({"driver": "535.104.05", "cuda": 12020, "gpus": nvml.gpus(2, "NVIDIA H100 80GB HBM3", 81559)})
    source = gpu_mod.discover()
    assert source.description == "nvml"
    inv = source.inventory()
    assert [(g.index, g.model, g.memory_mb, g.driver_version, g.cuda_version, g.simulated) for g in inv] == [
        (0, "NVIDIA H100 80GB HBM3", 81559, "535.104.05", "12.2", False),
        (1, "NVIDIA H100 80GB HBM3", 81559, "535.104.05", "12.2", False),
    ]
    sample = source.sample()
    assert [(m.utilization_pct, m.memory_used_mb, m.temperature_c, m.error) for m in sample] == [
        (0, 0, 40, None),
        (10, 100, 41, None),
    ]


def test_a_lost_gpu_is_an_error_in_its_metric_not_a_crash(fake_nvml: None) -> None:
    script = {"gpus": nvml.gpus(2)}
    nvml.install(script)
    source = gpu_mod.discover()
    script["gpus"][0]["error"] = "GpuIsLost"
    sample = source.sample()
    assert sample[0].error == "GPU is lost" and sample[1].error is None and sample[1].utilization_pct == 10


def test_a_gpu_lost_at_boot_stops_registration_with_a_clear_error(fake_nvml: None) -> None:
    script = {"gpus": nvml.gpus(2)}
    script["gpus"][1]["error"] = "GpuIsLost"
    nvml.install(script)
    with pytest.raises(AgentError, match="GPU 1 does not answer NVML \\(GPU is lost\\)"):
        gpu_mod.discover().inventory()


def test_no_driver_means_no_gpus_unless_simulated(fake_nvml: None) -> None:
    nvml.install({"init_error": "LibraryNotFound"})
    none = gpu_mod.discover()
    assert none.inventory() == [] and "NVML Shared Library Not Found" in none.description
    sim = gpu_mod.discover(SimulatedGpuSpec(count=3, model="Sim", memory_mb=1000))
    assert [g.simulated for g in sim.inventory()] == [True] * 3 and "simulated" in sim.description
    assert len(sim.sample()) == 3
    nvml.install({"gpus": []})
    assert gpu_mod.discover().inventory() == []


def test_probe_prints_inventory_and_a_sample_and_loads_no_server_code(tmp_path: Path) -> None:
    script = tmp_path / "nvml.json"
    script.write_text(json.dumps({"gpus": nvml.gpus(1)}))
    shadow = nvml.shadow_dir(tmp_path / "shadow")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{shadow}:{REPO}", "FAKE_NVML": str(script)}
    # `autoscaler agent --probe` as the console script runs it, then a look at what it imported.
    code = (
        "import sys; sys.argv = ['autoscaler', 'agent', '--probe']\n"
        "import autoscaler.cli as cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "import autoscaler.agent.loop\n"
        "server = ('sqlalchemy', 'fastapi', 'uvicorn', 'alembic', 'autoscaler.api', 'autoscaler.queueing',"
        " 'autoscaler.state')\n"
        "print('server modules:', sorted(m for m in server if m in sys.modules), file=sys.stderr)"
    )
    out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True)
    data = json.loads(out.stdout)
    assert data["source"] == "nvml" and data["gpus"][0]["uuid"] == "GPU-00000000-fake"
    assert data["metrics"][0]["memory_total_mb"] == 24576
    assert out.stderr.strip() == "server modules: []"


# -- metadata services ------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_metadata_clients_read_instance_id_and_notice(provider: str) -> None:
    fake = FakeMetadata(provider, instance_id=f"{provider}-123").start()
    try:
        client = metadata_service(provider, fake.url)
        assert client is not None
        assert client.instance_id() == f"{provider}-123"
        assert client.preemption_notice() is None
        before = datetime.now(UTC)
        fake.arm(notice_s=90)
        notice = client.preemption_notice()
        assert notice is not None and provider in notice.reason
        # The notice's own deadline: AWS's instance-action time, Azure's NotBefore, and
        # for GCP (whose flag has no time) 30 s from when the agent saw it.
        assert notice.deadline is not None
        expected = 30 if provider == "gcp" else 90
        assert abs((notice.deadline - before).total_seconds() - expected) < 3
        assert all(status in (200, 404) for _, _, status in fake.requests)  # headers were right
    finally:
        fake.stop()


def test_notice_times_are_parsed_as_utc_and_unreadable_ones_are_none() -> None:
    assert parse_iso("2026-03-10T12:02:00Z") == datetime(2026, 3, 10, 12, 2, tzinfo=UTC)
    assert parse_rfc1123("Tue, 10 Mar 2026 12:00:30 GMT") == datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC)
    assert parse_iso("soon") is None and parse_iso(None) is None
    assert parse_rfc1123("") is None and parse_rfc1123("not a date") is None


def test_the_checkpoint_grace_is_the_notice_less_a_per_cloud_margin() -> None:
    # AWS's two minutes are used nearly in full, not cut to a fixed 25 s.
    assert preempt_grace_s(120, margin_s=preempt_margin_s("aws", None), fallback_s=25) == 110
    assert preempt_grace_s(30, margin_s=preempt_margin_s("gcp", None), fallback_s=25) == 25
    assert preempt_grace_s(30, margin_s=preempt_margin_s("azure", 2.0), fallback_s=25) == 28
    # No time in the notice, or a deadline already past by this clock: the fallback grace.
    assert preempt_grace_s(None, margin_s=5, fallback_s=25) == 25
    assert preempt_grace_s(-3, margin_s=5, fallback_s=25) == 25
    # Less left than the margin: a short grace still lets the task see SIGTERM first.
    assert preempt_grace_s(3, margin_s=5, fallback_s=25) == 1


def test_unreachable_metadata_service_is_a_clear_error() -> None:
    client = metadata_service("gcp", "http://127.0.0.1:9")
    assert client is not None
    with pytest.raises(AgentError, match="cannot reach the gcp metadata service"):
        client.instance_id()
    assert metadata_service("static", None) is None


# -- wire contract ----------------------------------------------------------------------


def test_agent_requests_validate_against_the_server_schemas(fake_nvml: None) -> None:
    nvml.install({"gpus": nvml.gpus(1)})
    gpus = gpu_mod.discover()
    reg = RegisterBody(hostname="h", instance_id="i", provider="aws", pool="p", gpus=gpus.inventory())
    schemas.RegisterIn.model_validate(reg.model_dump())
    hb = HeartbeatBody(
        gpu_metrics=gpus.sample(),
        running=["t1"],
        draining=True,
        preempted=True,
        preempt_reason="gcp instance preempted",
        preempt_deadline=datetime(2026, 3, 10, 12, 0, 30, tzinfo=UTC),
    )
    schemas.HeartbeatIn.model_validate(hb.model_dump(mode="json"))
    schemas.FinishIn.model_validate(finish_report(StopRequest("spot"), -15).model_dump())
    with_logs = finish_report(StopRequest("spot"), -15).model_copy(
        update={"logs": [LogChunk(stream="stdout", data="x")]}
    )
    schemas.FinishIn.model_validate(with_logs.model_dump())
    schemas.LogsIn.model_validate({"chunks": [LogChunk(stream="stderr", data="x").model_dump()]})


def test_cli_reports_a_bad_bootstrap_file_in_one_line(tmp_path: Path) -> None:
    boot = _write(tmp_path, "{oops")
    out = subprocess.run(
        [PY, "-m", "autoscaler", "agent", "--bootstrap", str(boot)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
    )
    assert out.returncode == 1
    assert (
        out.stderr.strip() == f"error: bootstrap file {boot} is not valid JSON (line 1: Expecting property name "
        "enclosed in double quotes)"
    )


class _RecordingApi:
    """The outbox's side of ServerApi: records calls; unreachable while `down`."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str]] = []
        self.down = False

    def _call(self, kind: str, task_id: str, data: str = "") -> None:
        if self.down:
            raise ServerUnreachable("down")
        self.calls.append((kind, task_id, data))

    def start(self, task_id: str) -> None:
        self._call("start", task_id)

    def logs(self, task_id: str, chunks: list[LogChunk]) -> None:
        self._call("logs", task_id, "|".join(f"{c.stream}:{c.data}" for c in chunks))

    def finish(self, task_id: str, body: FinishBody) -> None:
        self._call("finish", task_id, "|".join(f"{c.stream}:{c.data}" for c in body.logs))


def test_output_waiting_for_delivery_is_sent_in_one_upload_in_order() -> None:
    api = _RecordingApi()
    box = Outbox()
    box.started("t1")
    api.down = True
    box.output("t1", [LogChunk(stream="stdout", data="a")])
    with pytest.raises(ServerUnreachable):
        box.deliver(cast(ServerApi, api))
    box.output("t1", [LogChunk(stream="stdout", data="b"), LogChunk(stream="stderr", data="e")])
    box.output("t2", [LogChunk(stream="stdout", data="other task")])  # never joins t1's
    box.output("t1", [LogChunk(stream="stdout", data="c")])
    box.finished("t1", FinishBody(reason="exit", exit_code=0))
    api.down = False
    box.deliver(cast(ServerApi, api))
    assert api.calls == [
        ("start", "t1", ""),
        ("logs", "t1", "stdout:ab|stderr:e"),
        ("logs", "t2", "stdout:other task"),
        ("logs", "t1", "stdout:c"),
        ("finish", "t1", ""),
    ]
    assert len(box) == 0


def test_the_last_output_goes_with_the_finish_to_a_server_that_takes_it() -> None:
    api = _RecordingApi()
    box = Outbox()
    box.finish_with_logs = True
    box.started("t1")
    box.output("t1", [LogChunk(stream="stdout", data="a")])
    box.output("t2", [LogChunk(stream="stdout", data="other task")])
    box.output("t1", [LogChunk(stream="stdout", data="b")])
    box.finished("t1", FinishBody(reason="exit", exit_code=0))
    api.down = True
    with pytest.raises(ServerUnreachable):
        box.deliver(cast(ServerApi, api))
    api.down = False
    box.deliver(cast(ServerApi, api))
    # Output not directly before its task's finish goes as before; the last goes with it.
    assert api.calls == [
        ("start", "t1", ""),
        ("logs", "t1", "stdout:a"),
        ("logs", "t2", "stdout:other task"),
        ("finish", "t1", "stdout:b"),
    ]
    assert len(box) == 0


def test_a_merged_finish_kept_over_an_outage_still_carries_its_output() -> None:
    api = _RecordingApi()
    box = Outbox()
    box.finish_with_logs = True
    box.output("t1", [LogChunk(stream="stderr", data="last words")])
    box.finished("t1", FinishBody(reason="exit", exit_code=1))
    with pytest.raises(ServerUnreachable):
        box.deliver(cast(ServerApi, _Failing()))  # the merged finish did not arrive: kept
    assert len(box) == 1
    box.deliver(cast(ServerApi, api))
    assert api.calls == [("finish", "t1", "stderr:last words")]


def test_a_server_that_does_not_take_output_in_a_finish_gets_it_apart() -> None:
    api = _RecordingApi()
    box = Outbox()  # finish_with_logs False: what the registration of an older server means
    box.output("t1", [LogChunk(stream="stdout", data="x")])
    box.finished("t1", FinishBody(reason="exit", exit_code=0))
    box.deliver(cast(ServerApi, api))
    assert api.calls == [("logs", "t1", "stdout:x"), ("finish", "t1", "")]


class _Failing(_RecordingApi):
    """Unreachable for the finish, after the request was built (as a timeout is)."""

    def finish(self, task_id: str, body: FinishBody) -> None:
        assert body.logs, "the finish was sent without its output"
        raise ServerUnreachable("timed out")
