"""The CLI as a user runs it: real processes, a real server, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import TEST_CONFIG, free_port


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autoscaler", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp_path = tmp_path_factory.mktemp("cli")
    config = tmp_path / "autoscaler.yaml"
    config.write_text(TEST_CONFIG)
    home = tmp_path / "home"
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoscaler",
            "server",
            "--config",
            str(config),
            "--home",
            str(home),
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"server did not start: {proc.stdout.read() if proc.stdout else ''}")
        time.sleep(0.2)
    yield {"AUTOSCALER_SERVER": url, "AUTOSCALER_HOME": str(home), "AUTOSCALER_TOKEN": ""}
    proc.terminate()
    proc.wait(timeout=20)


def test_enqueue_then_show_queued(server: dict[str, str]) -> None:
    env = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    r = cli("enqueue", "--queue", "gpu", "--gpus", "1", "--", "echo", "hi", env=env)
    assert r.returncode == 0, r.stderr
    task_id = r.stdout.strip()
    shown = json.loads(cli("task", "show", task_id, "--json", env=env).stdout)
    assert shown["state"] == "queued" and shown["command"] == ["echo", "hi"] and shown["gpus"] == 1
    listed = json.loads(cli("tasks", "--json", "--queue", "gpu", env=env).stdout)
    assert task_id in [t["id"] for t in listed]
    queues = json.loads(cli("queues", "--json", env=env).stdout)
    assert {q["name"]: q["depth"] for q in queues}["gpu"] >= 1
    canceled = cli("cancel", task_id, env=env)
    assert canceled.returncode == 0 and "canceled" in canceled.stdout


def test_home_dir_token_is_found_without_flags(server: dict[str, str]) -> None:
    # AUTOSCALER_TOKEN empty: the CLI falls back to HOME/admin.token written by the server.
    r = cli("queues", "--json", env=server)
    assert r.returncode == 0, r.stderr


def test_team_token_create_and_use(server: dict[str, str]) -> None:
    team_token = cli("token", "create", "--team", "nlp", env=server).stdout.strip()
    assert team_token.startswith("ast_")
    env = {**server, "AUTOSCALER_TOKEN": team_token}
    assert cli("enqueue", "-q", "cpu", "--", "true", env=env).returncode == 0
    r = cli("workers", env=env)
    assert r.returncode == 1 and "admin token" in r.stderr


@pytest.mark.parametrize(
    "args,needle",
    [
        (["task", "show", "0" * 32], "404: task"),
        (["enqueue", "--queue", "gpu", "--env", "NOEQUALS", "--", "true"], "KEY=VALUE"),
        (["token", "create"], "say which token"),
        (["token", "create", "--join", "--pool", "gpu-pool", "--ttl", "soon"], "duration 'soon'"),
        (["enqueue", "--queue", "gpu", "--gpus", "16", "--", "true"], "largest: 1x A10G, 4 CPUs, 16000 MB in pool"),
        (["enqueue", "-q", "cpu", "--cpus", "64", "--memory-mb", "500000", "--", "true"], "ask for at most 2 CPUs"),
        (["enqueue", "-q", "gpu", "--gpus", "1", "--gpu-type", "A10", "--", "true"], "GPU types offered: A10G"),
    ],
)
def test_user_mistakes_are_one_line(server: dict[str, str], args: list[str], needle: str) -> None:
    r = cli(*args, env=server)
    assert r.returncode == 1
    assert needle in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_unreachable_server_and_bad_config(tmp_path: Path) -> None:
    r = cli("tasks", "--server", f"http://127.0.0.1:{free_port()}", "--token", "x")
    assert r.returncode == 1 and "cannot reach the server" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - {name: p, provider: fake, max_instance: 3}\n")
    r = cli("server", "--config", str(bad), "--home", str(tmp_path / "h"))
    assert r.returncode == 1 and "pools.0.max_instance" in r.stderr and "Traceback" not in r.stderr


def test_refuses_public_address_without_tls(tmp_path: Path) -> None:
    r = cli("server", "--home", str(tmp_path / "h"), "--host", "0.0.0.0", "--port", str(free_port()))
    assert r.returncode == 1 and "without TLS" in r.stderr
