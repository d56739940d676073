"""The SDK against a real server (uvicorn on 127.0.0.1, SQLite): what each method
returns, and that every refusal is a typed error carrying the server's own message."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from autoscaler.api.context import AppContext
from autoscaler.sdk import (
    AuthError,
    Client,
    FeatureMissing,
    GitCode,
    NotFoundError,
    Rejected,
    SdkError,
    ServerUnreachable,
    SnapshotCode,
    WaitTimeout,
)
from autoscaler.sdk.body import REMOTE_OPTION_NAMES, TASK_OPTION_NAMES, task_body
from autoscaler.state.db import transaction
from autoscaler.state.models import TaskLog
from tests.conftest import LiveServer, free_port, issue_token


@pytest.fixture
def client(live_server: LiveServer, admin_token: str) -> Iterator[Client]:
    with Client(live_server.url, admin_token) as c:
        yield c


def test_submit_sends_every_option_and_the_handle_reads_the_task_back(client: Client) -> None:
    task = client.submit(
        ["python", "train.py", "--lr", "0.1"],
        queue="gpu",
        gpus=1,
        gpu_type="A10G",
        cpus=2,
        memory_mb=4096,
        env={"EPOCHS": "3"},
        secret_env={"WANDB_API_KEY": "s3cret"},
        working_dir="/srv/code",
        priority=5,
        max_attempts=2,
        retry_on_exit_codes=[1, 137],
        timeout_s=600,
        team="vision",
    )
    info = task.info()
    assert info.id == task.id and info.state == "queued" and not info.done
    assert info.command == ["python", "train.py", "--lr", "0.1"]
    assert (info.gpus, info.gpu_type, info.cpus, info.memory_mb) == (1, "A10G", 2, 4096)
    assert info.env == {"EPOCHS": "3"} and info.secret_env == {"WANDB_API_KEY": "***"}
    assert (info.working_dir, info.priority, info.max_attempts) == ("/srv/code", 5, 2)
    assert (info.retry_on_exit_codes, info.timeout_s, info.team) == ([1, 137], 600, "vision")
    assert info.events and info.events[0].to_state == "queued"
    assert info.raw["id"] == task.id  # the reply as it came, for --json
    assert task.id in [t.id for t in client.tasks(queue="gpu", state=["queued"])]
    why = task.why()
    assert why.task_id == task.id and why.state == "queued" and why.code and why.reason


def test_submit_takes_checkpoints_and_the_expected_run_time_like_the_cli(client: Client) -> None:
    task = client.submit(["train"], queue="gpu", gpus=1, checkpoints="every:30", expected_runtime="45m")
    info = task.info()
    assert info.checkpoints == "every:30" and info.expected_runtime_s == 45 * 60
    assert client.submit(["train"], queue="gpu", expected_runtime=7200).info().expected_runtime_s == 7200
    assert client.submit(["train"], queue="gpu", expected_runtime_s=90).info().expected_runtime_s == 90
    # The server checks the checkpoint spec and says what it accepts.
    with pytest.raises(Rejected, match="none, on-signal or every:MIN"):
        client.submit(["train"], queue="gpu", checkpoints="sometimes")


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"expected_runtime": "six hours"}, "expected_runtime 'six hours' is not a duration; use e.g. 90s, 45m"),
        ({"expected_runtime": -3}, "is not a duration"),
        ({"expected_runtime": "1h", "expected_runtime_s": 3600}, "not both"),
        ({"checkpoint": "on-signal"}, "unknown task option 'checkpoint': the options are"),
        # JSON has no NaN or infinity: these were a ValueError from the encoder, not a refusal.
        ({"timeout_s": math.nan}, "timeout_s nan is not a finite number"),
        ({"cpus": math.inf}, "cpus inf is not a finite number"),
        ({"expected_runtime_s": -math.inf}, "expected_runtime_s -inf is not a finite number"),
    ],
)
def test_a_bad_option_is_refused_before_any_request_saying_what_to_do(options: dict, words: str) -> None:
    # No server at all: the SDK refuses before it sends anything.
    with pytest.raises(SdkError) as err:
        task_body(["train"], queue="gpu", **options)
    assert words in str(err.value)


def test_cancel_then_wait_returns_the_ended_task_at_once(client: Client) -> None:
    task = client.submit(["true"], queue="gpu", team="vision")
    assert task.cancel().state == "canceled"
    started = time.monotonic()
    info = task.wait(timeout=30)
    assert info.state == "canceled" and info.done and time.monotonic() - started < 5
    assert task.output() == ""


def test_wait_gives_up_after_its_timeout_saying_what_the_task_is_doing(client: Client) -> None:
    task = client.submit(["true"], queue="gpu", gpus=1, team="vision")  # no agent: stays queued
    started = time.monotonic()
    with pytest.raises(WaitTimeout, match=f"task {task.id} is still queued after 0.5s") as caught:
        task.wait(timeout=0.5, poll_s=0.1)
    assert 0.5 <= time.monotonic() - started < 5
    assert f"autoscaler task why {task.id}" in caught.value.message


def test_an_unknown_task_is_not_found_with_the_servers_message(client: Client) -> None:
    with pytest.raises(NotFoundError) as caught:
        client.task("t-missing").info()
    assert caught.value.status == 404 and caught.value.detail == "task t-missing not found"
    assert caught.value.message == "404: task t-missing not found"  # what the CLI prints


def test_an_empty_task_id_is_refused_before_any_request() -> None:
    # It named the task list's URL: the list's reply failed to parse as a task (a pydantic traceback).
    with Client("http://127.0.0.1:9", "x") as c, pytest.raises(SdkError, match="no task id given"):
        c.task("")


def test_one_state_is_a_state_not_its_letters(client: Client) -> None:
    queued = client.submit(["true"], queue="gpu", gpus=1, team="vision")  # no agent: stays queued
    assert queued.id in [t.id for t in client.tasks(state="queued")]
    assert queued.id not in [t.id for t in client.tasks(state="running")]


def test_a_pasted_token_with_a_trailing_newline_works_and_a_broken_one_is_not_unreachable(
    live_server: LiveServer, admin_token: str
) -> None:
    # Both were "cannot reach the server (LocalProtocolError): is `autoscaler up` running?".
    with Client(live_server.url, admin_token + " \n") as c:
        assert isinstance(c.tasks(), list)
    for broken in ("ast_sec\nret", "ast_sec\x80ret", "ast_séc"):  # a control character, not ASCII
        with pytest.raises(SdkError) as caught:
            Client(live_server.url, broken).tasks()
        assert not isinstance(caught.value, ServerUnreachable)
        assert "the token holds characters an HTTP header cannot carry" in caught.value.message
        assert "sec" not in caught.value.message and "séc" not in caught.value.message  # never printed


def test_an_invalid_field_is_rejected_naming_the_field(client: Client) -> None:
    with pytest.raises(Rejected) as caught:
        client.submit(["true"], queue="gpu", gpus=-1)
    assert caught.value.status == 422 and "gpus" in caught.value.detail


def test_a_string_command_is_refused_before_any_request(client: Client) -> None:
    with pytest.raises(SdkError, match=r"\['python', 'train.py'\]"):
        client.submit("python train.py", queue="gpu")  # type: ignore[arg-type]


def test_a_misspelt_option_is_refused_naming_it_and_the_options(client: Client) -> None:
    """A script nobody type-checks gets what mypy would have said, before any request."""
    with pytest.raises(SdkError) as caught:
        client.submit(["true"], queue="gpu", gpu=1)  # type: ignore[call-arg]
    assert "unknown task option 'gpu'" in caught.value.message and "gpus" in caught.value.message
    assert client.tasks() == []


def test_the_options_are_one_definition_shared_by_submit_the_cli_and_run_remotely() -> None:
    """run_remotely takes every option of submit but the two it sets itself."""
    assert {"working_dir", "code"} == TASK_OPTION_NAMES - REMOTE_OPTION_NAMES
    assert {"checkpoints", "expected_runtime_s", "nodes", "secret_env"} <= REMOTE_OPTION_NAMES
    assert set(task_body(["true"], queue="gpu")) - {"queue", "command"} <= TASK_OPTION_NAMES


def test_a_wrong_token_and_a_team_token_out_of_its_team_are_auth_errors(live_server: LiveServer) -> None:
    with Client(live_server.url, "not-a-token") as c, pytest.raises(AuthError) as caught:
        c.tasks()
    assert caught.value.status == 401
    team_token = issue_token(live_server.ctx, "team", team="nlp")
    with Client(live_server.url, team_token) as c, pytest.raises(AuthError, match="cannot enqueue for team vision"):
        c.submit(["true"], queue="gpu", team="vision")


def test_no_server_is_unreachable_saying_where_it_looked() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with Client(url, "x", timeout=2) as c, pytest.raises(ServerUnreachable, match=f"cannot reach the server at {url}"):
        c.tasks()


def test_server_and_token_come_from_the_environment_then_the_home_files(
    live_server: LiveServer, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOSCALER_SERVER", live_server.url + "/")
    monkeypatch.setenv("AUTOSCALER_TOKEN", admin_token)
    with Client() as c:
        assert c.server == live_server.url and c.tasks() == []
    monkeypatch.delenv("AUTOSCALER_SERVER")
    monkeypatch.setenv("AUTOSCALER_TOKEN", "")  # empty counts as unset, as in the CLI
    (tmp_path / "server.url").write_text(live_server.url + "\n")
    (tmp_path / "admin.token").write_text(admin_token + "\n")
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path))
    with Client() as c:
        assert c.server == live_server.url and c.tasks() == []
    with Client(token="wrong") as c, pytest.raises(AuthError):  # an argument wins over the file
        c.tasks()
    monkeypatch.delenv("AUTOSCALER_HOME")
    with Client(home=str(tmp_path)) as c:  # a string, as a script writes it (was a TypeError)
        assert c.server == live_server.url and c.tasks() == []


# What FastAPI answers for a path it has no route for, on a server that predates the stores.
OLDER_SERVER_LACKS = re.compile(r"/api/v1/snapshots|/api/v1/tasks/[^/]+/artifacts(/.*)?")


@pytest.fixture
def older_server(ctx: AppContext) -> Iterator[LiveServer]:
    """A server without the snapshot and artifact endpoints (one that predates them)."""
    server = LiveServer(ctx)

    @server.app.middleware("http")
    async def no_such_route(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if OLDER_SERVER_LACKS.fullmatch(request.url.path):
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return await call_next(request)

    server.start()
    yield server
    server.stop()


def test_a_server_without_the_stores_says_so_instead_of_not_found(older_server: LiveServer, tmp_path: Path) -> None:
    with Client(older_server.url, issue_token(older_server.ctx, "admin")) as c:
        task = c.submit(["true"], queue="gpu", team="vision")
        with pytest.raises(FeatureMissing, match=r"has no artifact store .GET /api/v1/tasks/.*/artifacts is not there"):
            task.artifacts()
        with pytest.raises(FeatureMissing, match="has no artifact store"):
            task.download("model.pt", tmp_path / "out")
        assert not (tmp_path / "out" / "model.pt").exists() and not (tmp_path / "out" / "model.pt.part").exists()
        archive = tmp_path / "code.tar.gz"
        archive.write_bytes(b"\x1f\x8b not really")
        with pytest.raises(FeatureMissing, match=r"has no snapshot store .POST /api/v1/snapshots is not there"):
            c.upload_snapshot(archive)


def test_a_404_from_a_route_stays_not_found(client: Client) -> None:
    """Only FastAPI's "no such route" means a missing feature; "no such task" is passed on."""
    with pytest.raises(NotFoundError) as caught:
        client.task("t-missing").why()
    assert not isinstance(caught.value, FeatureMissing) and "t-missing" in caught.value.message


def test_an_artifact_name_that_leaves_the_directory_is_refused(client: Client, tmp_path: Path) -> None:
    with pytest.raises(SdkError, match="outside"):
        client.task("t-any").download("../../etc/passwd", tmp_path / "out")
    with pytest.raises(SdkError, match="outside"):  # a string directory too (was a TypeError)
        client.task("t-any").download("../../etc/passwd", str(tmp_path / "out"))
    assert not (tmp_path / "etc").exists()


def test_the_code_carrying_fields_are_sent_only_when_set() -> None:
    """These fields are served by other branches of issue 18: tested here by the body only."""
    plain = task_body(["true"], queue="gpu")
    for field in ("image", "image_pull_secret", "code", "setup", "outputs", "checkpoint_dir", "checkpoint_every_s"):
        assert field not in plain
    full = task_body(
        ["python", "train.py"],
        queue="gpu",
        image="pytorch/pytorch:2.3",
        image_pull_secret="REGISTRY_TOKEN",
        code=SnapshotCode("sha256:" + "a" * 64),
        setup="pip install -r requirements.txt",
        outputs=["out/*.json"],
        checkpoint_dir="ckpt",
        checkpoint_every_s=300,
    )
    assert full["image"] == "pytorch/pytorch:2.3" and full["image_pull_secret"] == "REGISTRY_TOKEN"
    assert full["code"] == {"snapshot": "sha256:" + "a" * 64}
    assert full["setup"] == "pip install -r requirements.txt" and full["outputs"] == ["out/*.json"]
    assert (full["checkpoint_dir"], full["checkpoint_every_s"]) == ("ckpt", 300)
    git = task_body(["true"], queue="gpu", code=GitCode("https://example.org/r.git", "abc123"))
    assert git["code"] == {"git": "https://example.org/r.git", "ref": "abc123", "diff_snapshot": None}


def test_logs_read_past_one_page_of_chunks(client: Client, live_server: LiveServer) -> None:
    """More output than the server sends in one reply (1000 chunks) comes back whole, in order."""
    task = client.submit(["true"], queue="gpu", team="vision")
    with transaction(live_server.ctx.sessions) as s:
        now = live_server.ctx.clock.now()
        s.add_all(
            TaskLog(task_id=task.id, attempt=1, stream="stdout" if n % 3 else "stderr", data=f"{n}\n", at=now)
            for n in range(2500)
        )
    chunks = list(task.logs())
    assert [c.data for c in chunks] == [f"{n}\n" for n in range(2500)]
    assert task.output("stderr") == "".join(f"{n}\n" for n in range(0, 2500, 3))
    assert [c.data for c in task.logs(after=chunks[2399].id)] == [f"{n}\n" for n in range(2400, 2500)]


def test_the_sdk_finds_the_home_directory_where_the_server_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoscaler import config
    from autoscaler.sdk import settings

    monkeypatch.delenv("AUTOSCALER_HOME", raising=False)
    assert settings.default_home() == config.default_home()
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path))
    assert settings.default_home() == config.default_home() == tmp_path


@pytest.mark.parametrize("task_id", ["\x1f", "a/b", "../tasks", "id?x=1", "sp ace"])
def test_a_task_id_of_any_text_is_a_clean_not_found(client: Client, task_id: str) -> None:
    # Found by the CLI fuzz: `autoscaler logs $'\x1f'` broke the URL with a traceback.
    task = client.task(task_id)
    for call in (task.info, task.why, lambda: list(task.logs())):
        with pytest.raises(NotFoundError):
            call()
