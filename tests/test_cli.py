"""The CLI as a user runs it: real processes, a real server, one-line errors."""

from __future__ import annotations

import json
import os
import re
import signal
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


def test_task_show_and_tasks_say_failed_attempts_and_interruptions(server: dict[str, str]) -> None:
    env = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    r = cli("enqueue", "-q", "cpu", "--max-attempts", "2", "--retry-on-exit-codes", "1, 137", "--", "false", env=env)
    assert r.returncode == 0, r.stderr
    task_id = r.stdout.strip()
    # A worker runs it: a spot reclaim, then an exit 1 (retried), through the real API.
    join = cli("token", "create", "--join", "--pool", "cpu-pool", env=env).stdout.strip()
    reg = httpx.post(
        f"{server['AUTOSCALER_SERVER']}/api/v1/workers/register",
        headers={"Authorization": f"Bearer {join}"},
        json={"hostname": "h", "instance_id": "i-cli-retries", "provider": "fake", "pool": "cpu-pool"},
    ).json()
    api = httpx.Client(
        base_url=f"{server['AUTOSCALER_SERVER']}/api/v1/workers/{reg['worker_id']}",
        headers={"Authorization": f"Bearer {reg['worker_token']}"},
    )
    for end in ({"reason": "interrupted", "detail": "spot"}, {"reason": "exit", "exit_code": 1}):
        deadline = time.monotonic() + 10
        while (leased := api.post("/lease").json()["task"]) is None or leased["id"] != task_id:
            assert time.monotonic() < deadline, "the task was not leased"
            if leased is not None:  # another test's task: finish it and try again
                api.post(f"/tasks/{leased['id']}/finish", json={"reason": "exit", "exit_code": 0})
            time.sleep(0.1)
        assert api.post(f"/tasks/{task_id}/finish", json=end).status_code == 200
    shown = cli("task", "show", task_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "failed attempts 1 of 2, interruptions 1" in shown.stdout, shown.stdout
    assert "retries: only exit codes 1, 137" in shown.stdout
    as_json = json.loads(cli("task", "show", task_id, "--json", env=env).stdout)
    assert (as_json["failures"], as_json["interruptions"], as_json["retry_on_exit_codes"]) == (1, 1, [1, 137])
    listed = cli("tasks", "--queue", "cpu", "--state", "queued", env={**env, "COLUMNS": "200"})
    row = next(line for line in listed.stdout.splitlines() if task_id[:8] in line)
    assert "1/2" in row and "failed" in listed.stdout and "interrupted" in listed.stdout, listed.stdout


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


def test_task_why_with_team_tokens(server: dict[str, str]) -> None:
    vision = {**server, "AUTOSCALER_TOKEN": cli("token", "create", "--team", "vision", env=server).stdout.strip()}
    nlp = {**server, "AUTOSCALER_TOKEN": cli("token", "create", "--team", "nlp", env=server).stdout.strip()}
    task_id = cli("enqueue", "-q", "gpu", "--gpus", "1", "--", "true", env=vision).stdout.strip()
    r = cli("task", "why", task_id, env=vision)
    assert r.returncode == 0 and task_id in r.stdout and "queued" in r.stdout, r.stderr
    answer = json.loads(cli("task", "why", task_id, "--json", env=vision).stdout)
    assert answer["task_id"] == task_id and answer["code"] and answer["reason"]
    other = cli("task", "why", task_id, env=nlp)
    assert other.returncode == 1 and "not found" in other.stderr and len(other.stderr.strip().splitlines()) == 1
    # explain is no longer admin-only: a team token gets its part (none recorded here).
    explained = cli("explain", env=nlp)
    assert "admin token" not in explained.stderr


def test_enqueue_with_an_image_and_its_pull_secret(server: dict[str, str]) -> None:
    env = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    image = "registry.example:5000/team/train:1.2"
    args = ["enqueue", "-q", "gpu", "--gpus", "1", "--image", image]
    r = cli(*args, "--secret-env", "REG=robot:pw", "--image-pull-secret", "REG", "--", "python", "t.py", env=env)
    assert r.returncode == 0, r.stderr
    task_id = r.stdout.strip()
    shown = cli("task", "show", task_id, env=env)
    assert f"image: {image} (pull secret REG)" in shown.stdout and "robot:pw" not in shown.stdout
    as_json = json.loads(cli("task", "show", task_id, "--json", env=env).stdout)
    assert (as_json["image"], as_json["image_pull_secret"]) == (image, "REG")
    plain = json.loads(
        cli("task", "show", cli("enqueue", "-q", "gpu", "--", "true", env=env).stdout.strip(), "--json", env=env).stdout
    )
    assert plain["image"] is None  # without --image a task runs on the machine, as before
    dangling = cli(*args, "--image-pull-secret", "NOPE", "--", "true", env=env)
    assert dangling.returncode == 1 and "not one of the task's secret_env names" in dangling.stderr
    assert "Traceback" not in dangling.stderr
    bad = cli("enqueue", "-q", "gpu", "--image", "--privileged", "--", "true", env=env)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr


SECRET = "wandb-Zq8r3VtLk2mN9pX4sW7y"
FILE_SECRET = "hf_Jt6Yc2Bn8Kd4Ls1Qw9Ee with spaces"
SHELL_SECRET = "sk-Pw3Rt5Yu7Io9Pa1Sd"


def test_secret_env_is_sent_but_never_printed(server: dict[str, str], tmp_path: Path) -> None:
    env = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    key_file = Path(server["AUTOSCALER_HOME"], "secret.key")
    assert key_file.exists() and key_file.stat().st_mode & 0o077 == 0  # made 0600 by the server's first start
    dotenv = tmp_path / "secrets.env"
    dotenv.write_text(f"# from the vault\nexport HF_TOKEN='{FILE_SECRET}'\n\nWANDB_API_KEY=overridden\n")
    r = cli(
        "enqueue",
        "-q",
        "gpu",
        "--gpus",
        "1",
        "--env",
        "EPOCHS=3",
        "--secret-env-from-file",
        str(dotenv),
        "--secret-env",
        f"WANDB_API_KEY={SECRET}",
        "--secret-env",
        "OPENAI_API_KEY",
        "--",
        "python",
        "train.py",
        env={**env, "OPENAI_API_KEY": SHELL_SECRET},
    )
    assert r.returncode == 0, r.stderr
    task_id = r.stdout.strip()
    outputs = [r.stdout + r.stderr]
    shown = cli("task", "show", task_id, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "secret env: HF_TOKEN=*** OPENAI_API_KEY=*** WANDB_API_KEY=***" in shown.stdout
    assert "env: EPOCHS=3" in shown.stdout  # plain env stays plain
    as_json = json.loads(cli("task", "show", task_id, "--json", env=env).stdout)
    assert as_json["secret_env"] == {"HF_TOKEN": "***", "OPENAI_API_KEY": "***", "WANDB_API_KEY": "***"}
    for args in (
        ["task", "show", task_id],
        ["task", "show", task_id, "--json"],
        ["tasks"],
        ["tasks", "--json"],
        ["task", "why", task_id],
        ["enqueue", "-q", "gpu", "--json", "--secret-env", f"K={SECRET}", "--", "true"],
    ):
        done = cli(*args, env=env)
        assert done.returncode == 0, (args, done.stderr)
        outputs.append(done.stdout + done.stderr)
    # Mistakes: refused in one line that never repeats the value.
    both = cli(
        "enqueue",
        "-q",
        "gpu",
        "--env",
        "WANDB_API_KEY=x",
        "--secret-env",
        f"WANDB_API_KEY={SECRET}",
        "--",
        "true",
        env=env,
    )
    assert both.returncode == 1 and "given both in env and in secret_env" in both.stderr
    dotenv.write_text(f"OK=1\n{SECRET}\n")
    bad_line = cli("enqueue", "-q", "gpu", "--secret-env-from-file", str(dotenv), "--", "true", env=env)
    assert bad_line.returncode == 1 and f"{dotenv}:2: expected NAME=VALUE" in bad_line.stderr
    bad_flag = cli("enqueue", "-q", "gpu", "--secret-env", f"{SECRET}:oops=1", "--", "true", env=env)
    assert bad_flag.returncode == 1 and "--secret-env #1" in bad_flag.stderr
    unset = cli("enqueue", "-q", "gpu", "--secret-env", "NOT_SET_ANYWHERE", "--", "true", env=env)
    assert unset.returncode == 1 and "NOT_SET_ANYWHERE is not set" in unset.stderr
    outputs += [both.stderr, bad_line.stderr, bad_flag.stdout + bad_flag.stderr, unset.stderr]
    printed = "\n".join(outputs)
    for value in (SECRET, FILE_SECRET, SHELL_SECRET, "overridden"):
        assert value not in printed


def test_secret_key_rotate_and_reseal(tmp_path: Path) -> None:
    home = tmp_path / "home"
    config = tmp_path / "autoscaler.yaml"
    config.write_text(TEST_CONFIG)
    args = ["--config", str(config), "--home", str(home)]
    assert cli("db", "upgrade", *args).returncode == 0
    first = cli("secret-key", "rotate", *args)  # no file yet: it makes one with a single key
    assert first.returncode == 0 and "kept" not in first.stdout, first.stderr
    second = cli("secret-key", "rotate", *args)
    assert second.returncode == 0 and "kept" in second.stdout, second.stderr
    keys = [line for line in (home / "secret.key").read_text().splitlines() if line and not line.startswith("#")]
    assert len(keys) == 2 and (home / "secret.key").stat().st_mode & 0o077 == 0
    resealed = cli("secret-key", "reseal", *args)
    assert resealed.returncode == 0 and "resealed the secret env of 0 tasks" in resealed.stdout, resealed.stderr
    assert "may be removed" in resealed.stdout


@pytest.mark.parametrize("command", [["secret-key", "rotate"], ["secret-key", "reseal"], ["db", "downgrade", "base"]])
def test_a_home_that_does_not_exist_is_refused_not_made(tmp_path: Path, command: list[str]) -> None:
    typo = tmp_path / "typo"  # `secret-key rotate` made it (and a key file in it); `db downgrade` was a traceback
    r = cli(*command, "--home", str(typo))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"error: home {typo} does not exist: check --home (or AUTOSCALER_HOME)" in r.stderr
    assert not typo.exists()


def test_a_key_file_in_a_directory_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    (tmp_path / "home").mkdir()
    key = tmp_path / "nowhere" / "secret.key"
    r = cli("secret-key", "rotate", "--home", str(tmp_path / "home"), env={"AUTOSCALER_SECRET_KEY_FILE": str(key)})
    assert r.returncode == 1 and f"directory {key.parent} does not exist" in r.stderr, r.stderr
    assert not key.parent.exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["task", "show", "0" * 32], "404: task"),
        (["enqueue", "--queue", "gpu", "--env", "NOEQUALS", "--", "true"], "KEY=VALUE"),
        (["token", "create"], "say which token"),
        (["enqueue", "--queue", "gpu", "--retry-on-exit-codes", "1,x", "--", "true"], "'x' is not a number"),
        (["enqueue", "--queue", "gpu", "--retry-on-exit-codes", "300", "--", "true"], "300 is not an exit code 1-255"),
        (["enqueue", "--queue", "gpu", "--max-attempts", "0", "--", "true"], "max_attempts: Input should be greater"),
        (["token", "create", "--join", "--pool", "gpu-pool", "--ttl", "soon"], "duration 'soon'"),
        (["enqueue", "--queue", "gpu", "--gpus", "16", "--", "true"], "largest: 1x A10G, 4 CPUs, 16000 MB in pool"),
        (["enqueue", "-q", "cpu", "--cpus", "64", "--memory-mb", "500000", "--", "true"], "ask for at most 2 CPUs"),
        (["enqueue", "-q", "gpu", "--gpus", "1", "--gpu-type", "A10", "--", "true"], "GPU types offered: A10G"),
        # An admin's --team must name a team of this deployment (issue 23 item 8).
        (
            ["enqueue", "-q", "gpu", "--team", "nosuch", "--", "true"],
            "unknown team 'nosuch' (known: default, vision, nlp)",
        ),
        (["tasks", "--team", "nosuch"], "unknown team 'nosuch'"),
        # A --queue or --pool filter naming nothing printed an empty list, as if it were idle.
        (["tasks", "--queue", "nosuch"], "404: queue 'nosuch' does not exist (known: gpu, cpu, vision-only)"),
        (["instances", "--pool", "nosuch"], "404: pool 'nosuch' is not configured (known: gpu-pool, cpu-pool)"),
        (["enqueue", "-q", "nosuch", "--", "true"], "404: queue 'nosuch' does not exist (known: gpu, cpu)"),
        (["spend", "--team", "visoin"], "add it under teams: in autoscaler.yaml"),
        (["alerts", "--team", "nosuch"], "unknown team 'nosuch'"),
        (["token", "create", "--team", "nosuch"], "needs a known team"),
        # NaN and infinity parse as floats but JSON cannot carry them: refused before sending.
        (["enqueue", "-q", "gpu", "--timeout", "nan", "--", "true"], "timeout_s nan is not a finite number"),
        (["enqueue", "-q", "gpu", "--cpus", "inf", "--", "true"], "cpus inf is not a finite number"),
        # An empty id named the task list's URL: a pydantic traceback, or "404: Not Found".
        (["task", "show", ""], "no task id given"),
        (["logs", ""], "no task id given"),
        # The server's refusal was its regex: "body.env.1A.[key]: String should match pattern '^[A-Za-z_]...".
        (["enqueue", "-q", "gpu", "--env", "1A=x", "--", "true"], "'1A' is not a variable name (letters, digits"),
        # An empty value (an unset shell variable) was read as "not given": with --image "" the
        # task ran on the machine instead of in a container, --code "" and --git "" sent no code.
        (["enqueue", "-q", "gpu", "--image", "", "--", "true"], "body.image: String should have at least 1 character"),
        (["enqueue", "-q", "gpu", "--workdir", "", "--", "true"], "body.working_dir: String should have at least 1"),
        (["enqueue", "-q", "gpu", "--code", "", "--", "true"], "--code is empty: give a directory"),
        (["enqueue", "-q", "gpu", "--git", " ", "--", "true"], "--git is empty: give a repository URL"),
        # A name the API's pattern refuses is said in words, not as the regex.
        (["enqueue", "-q", "GPU", "--", "true"], "body.queue: 'GPU' is not a name: lowercase letters, digits"),
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


@pytest.mark.parametrize(
    "variable,value,needle",
    [
        # Each was a traceback: pydantic's, psycopg's, SQLAlchemy's (the password printed in it).
        ("AUTOSCALER_PORT", "abc", "error: environment: AUTOSCALER_PORT='abc': Input should be a valid integer"),
        (
            "AUTOSCALER_DATABASE_URL",
            "postgresql://u:sekrit@127.0.0.1:{port}/db",
            "error: cannot open the database at postgresql://u:***@127.0.0.1:{port}/db: connection failed",
        ),
        ("AUTOSCALER_DATABASE_URL", "mysql://h/db", "error: database_url mysql://h/db: this service cannot use it"),
        ("AUTOSCALER_DATABASE_URL", "nonsense", "error: database_url (not a URL): this service cannot use it"),
    ],
)
def test_a_bad_environment_override_is_one_line_at_start(
    tmp_path: Path, variable: str, value: str, needle: str
) -> None:
    port = str(free_port())
    env = {variable: value.format(port=port)}
    for command in (["server", "--port", str(free_port())], ["db", "upgrade"]):
        r = cli(*command, "--home", str(tmp_path / "h"), env=env)
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().splitlines()[-1].startswith(needle.format(port=port)), r.stderr
        assert "sekrit" not in r.stderr + r.stdout


def test_a_typo_in_pool_options_stops_startup_at_its_key_path(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - {name: p, provider: aws, region: us-east-1, options: {subnet: [subnet-1]}}\n")
    r = cli("server", "--config", str(bad), "--home", str(tmp_path / "h"))
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "at pools.0.options.subnet: unknown option; did you mean 'subnets'?" in r.stderr


def test_login_page_says_where_the_admin_token_is(server: dict[str, str]) -> None:
    page = httpx.get(f"{server['AUTOSCALER_SERVER']}/login", timeout=10).text
    assert str(Path(server["AUTOSCALER_HOME"]) / "admin.token") in page


def test_a_known_queue_or_pool_with_nothing_in_it_lists_nothing(server: dict[str, str]) -> None:
    admin = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    team = {**server, "AUTOSCALER_TOKEN": cli("token", "create", "--team", "nlp", env=admin).stdout.strip()}
    for env in (admin, team):
        # `server` runs no reconciler, so no pool has an instance; nlp has no task in vision-only.
        for args in (["instances", "--pool", "gpu-pool"], ["tasks", "--queue", "vision-only"]):
            r = cli(*args, "--json", env=env)
            assert r.returncode == 0 and json.loads(r.stdout) == [], (args, r.stderr)
    # A team token is told the queues its team may use.
    r = cli("tasks", "--queue", "nosuch", env=team)
    assert r.returncode == 1 and "(known: gpu, cpu)" in r.stderr, r.stderr


def test_known_teams_are_still_accepted(server: dict[str, str]) -> None:
    r = cli("enqueue", "-q", "gpu", "--team", "vision", "--", "true", env=server)
    assert r.returncode == 0, r.stderr
    listed = json.loads(cli("tasks", "--team", "vision", "--json", env=server).stdout)
    assert r.stdout.strip() in [t["id"] for t in listed] and {t["team"] for t in listed} == {"vision"}
    assert cli("spend", "--team", "default", env=server).returncode == 0


def _announced(config: Path, home: Path) -> str:
    """What a server prints once it answers (then it is stopped)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "autoscaler", "server", "-c", str(config), "--home", str(home), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
        return out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(
    "text,warned,quiet",
    [
        ("", ["no queues configured", "no pools configured", "no teams configured"], []),
        ("teams: [{name: a}]\n", ["no queues configured", "no pools configured"], ["no teams configured"]),
    ],
)
def test_a_config_that_cannot_serve_work_is_warned_about_at_start(
    tmp_path: Path, text: str, warned: list[str], quiet: list[str]
) -> None:
    config = tmp_path / "autoscaler.yaml"
    config.write_text(text)
    out = _announced(config, tmp_path / "home")
    assert "control plane at" in out, out
    for needle in warned:
        assert f"warning: {needle}" in out, out
    for needle in quiet:
        assert needle not in out, out


def test_a_complete_config_starts_without_warnings(tmp_path: Path) -> None:
    config = tmp_path / "autoscaler.yaml"
    config.write_text(TEST_CONFIG)
    out = _announced(config, tmp_path / "home")
    assert "control plane at" in out and "warning:" not in out, out


def test_refuses_public_address_without_tls(tmp_path: Path) -> None:
    r = cli("server", "--home", str(tmp_path / "h"), "--host", "0.0.0.0", "--port", str(free_port()))
    assert r.returncode == 1 and "without TLS" in r.stderr


# -- what users typed is shown literally; nothing is cut off a terminal --------------

MARKUP_ARGS = ["echo", "[red]hello[/red]", "[/]", "[bold]x"]
COMPREHENSION = "print([x * 2 for x in range(3)])"
LONG_INSTANCE = "i-" + "0123456789abcdef" * 6  # wider than 80 columns on its own


@pytest.fixture(scope="module")
def finished_tasks(server: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Tasks with brackets, a comprehension, a missing program, a missing working dir,
    a timeout and a non-zero exit, each run to its end by a real agent (cpu-pool)."""
    from tests.conftest import FAST_AGENT

    tmp = tmp_path_factory.mktemp("cli-agent")
    admin = {**server, "AUTOSCALER_TOKEN": Path(server["AUTOSCALER_HOME"], "admin.token").read_text().strip()}
    join = cli("token", "create", "--join", "--pool", "cpu-pool", env=admin).stdout.strip()
    agent_log = tmp / "agent.log"
    with agent_log.open("wb") as fh:
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autoscaler",
                "agent",
                "--server",
                server["AUTOSCALER_SERVER"],
                "--pool",
                "cpu-pool",
                "--provider",
                "static",
                "--instance-id",
                LONG_INSTANCE,
                "--work-dir",
                str(tmp / "work"),
                "--max-tasks",
                "6",
                *FAST_AGENT,
            ],
            env={**os.environ, "AUTOSCALER_JOIN_TOKEN": join},
            stdout=fh,
            stderr=subprocess.STDOUT,
        )

    def enqueue(*args: str) -> str:
        r = cli("enqueue", "-q", "cpu", "--team", "nlp", *args, env=admin)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    ids = {
        "markup": enqueue("--env", "GREETING=[red]hi[/red] [/]", "--", *MARKUP_ARGS),
        "comprehension": enqueue("--", sys.executable, "-c", COMPREHENSION),
        "missing": enqueue("--", "nosuchprogram-xyz"),
        "workdir": enqueue("--workdir", str(tmp / "nowhere"), "--", "true"),
        "timeout": enqueue("--timeout", "0.5", "--max-attempts", "1", "--", "sleep", "30"),
        "exit3": enqueue("--max-attempts", "1", "--", "sh", "-c", "exit 3"),
    }
    try:
        deadline = time.monotonic() + 60
        while True:
            states = [json.loads(cli("task", "show", t, "--json", env=admin).stdout)["state"] for t in ids.values()]
            if all(s in ("succeeded", "failed") for s in states):
                break
            assert time.monotonic() < deadline, f"tasks did not finish: {states}\n{agent_log.read_text()}"
            time.sleep(0.5)
        yield {**ids, **{f"env:{k}": v for k, v in admin.items()}}
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)


def _admin(finished: dict[str, str]) -> dict[str, str]:
    return {k[4:]: v for k, v in finished.items() if k.startswith("env:")}


def test_markup_in_commands_and_env_is_printed_literally(finished_tasks: dict[str, str]) -> None:
    env = _admin(finished_tasks)
    shown = cli("task", "show", finished_tasks["markup"], env=env)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    # The command as a shell line that can be pasted back.
    assert "command: echo '[red]hello[/red]' '[/]' '[bold]x'" in shown.stdout
    assert "env: 'GREETING=[red]hi[/red] [/]'" in shown.stdout
    assert "end: exit 0" in shown.stdout
    listed = cli("tasks", env=env)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert "echo '[red]hello[/red]' '[/]' '[bold]x'" in listed.stdout
    assert COMPREHENSION in listed.stdout  # a list comprehension does not vanish
    assert "[x * 2 for x in range(3)]" in cli("task", "show", finished_tasks["comprehension"], env=env).stdout
    logs = cli("logs", finished_tasks["markup"], env=env)
    assert logs.stdout == "[red]hello[/red] [/] [bold]x\n" and logs.stderr == ""
    # A team token sees the same list without a crash.
    team = cli("token", "create", "--team", "nlp", env=env).stdout.strip()
    assert "[red]hello[/red]" in cli("tasks", env={**env, "AUTOSCALER_TOKEN": team}).stdout


def test_markup_in_names_and_error_messages_is_printed_literally(
    server: dict[str, str], finished_tasks: dict[str, str]
) -> None:
    env = _admin(finished_tasks)
    for args in (["queues"], ["workers"], ["instances"], ["tasks", "--state", "failed"]):
        r = cli(*args, env=env)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)
    r = cli("enqueue", "-q", "[red]nosuch[/]", "--", "true", env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    # The server's message quotes the name, brackets and all: printed as sent, not eaten as markup.
    assert "body.queue: '[red]nosuch[/]' is not a name" in r.stderr
    r = cli("enqueue", "-q", "cpu", "--env", "[/]", "--", "true", env=env)
    assert r.returncode == 1 and "--env '[/]' must look like KEY=VALUE" in r.stderr


def test_task_show_says_why_each_attempt_ended(finished_tasks: dict[str, str]) -> None:
    env = _admin(finished_tasks)

    def show(key: str) -> str:
        r = cli("task", "show", finished_tasks[key], env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "detail" in show("missing") and "cannot start 'nosuchprogram-xyz'" in show("missing")
    assert "does not exist" in show("workdir")
    assert "timeout after 0.5s" in show("timeout")
    exit3 = show("exit3")
    assert "end: exit 3" in exit3 and "exit_code" not in exit3
    # The attempts table's figures as the cost line has them (a raw float printed 1.6014999999999998e-05).
    (attempt_row,) = [ln for ln in exit3.splitlines() if re.match(r"│ 1 +│", ln)]
    assert re.search(r"│ \d+\.\d{4} +│ \d+\.\d{4} +│$", attempt_row), attempt_row
    assert "exit 3" in cli("tasks", "--state", "failed", env=env).stdout


def test_logs_of_a_task_that_did_not_start_say_why(finished_tasks: dict[str, str]) -> None:
    env = _admin(finished_tasks)
    for key, why in (("missing", "cannot start 'nosuchprogram-xyz'"), ("workdir", "does not exist")):
        for follow in ([], ["--follow"]):
            r = cli("logs", finished_tasks[key], *follow, env=env)  # it printed nothing at all
            assert r.returncode == 0 and r.stdout == "", r.stderr
            assert r.stderr.startswith(f"{finished_tasks[key]}: the command did not start: ") and why in r.stderr
    assert cli("logs", finished_tasks["exit3"], env=env).stderr == ""  # a task that ran: its output only


def test_tables_off_a_terminal_keep_full_ids_and_timestamps(finished_tasks: dict[str, str]) -> None:
    env = _admin(finished_tasks)
    r = cli("workers", env=env)  # stdout is a pipe here, as in `autoscaler workers | grep`
    assert r.returncode == 0, r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if LONG_INSTANCE in ln]  # one line, not cut
    worker = next(w for w in json.loads(cli("workers", "--json", env=env).stdout) if w["instance_id"] == LONG_INSTANCE)
    assert worker["id"] in line
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+", line), line  # the whole timestamp
    assert "…" not in r.stdout
    for key in ("markup", "timeout"):
        shown = cli("task", "show", finished_tasks[key], env=env).stdout
        assert finished_tasks[key] in shown and "…" not in shown
    # A terminal too narrow for all columns (COLUMNS): ids stay whole, other cells wrap,
    # and what cannot fit is left out with a note, never cut with an ellipsis.
    narrow = cli("workers", env={**env, "COLUMNS": "160"})
    assert narrow.returncode == 0 and "…" not in narrow.stdout
    assert worker["id"] in narrow.stdout and LONG_INSTANCE in narrow.stdout
    assert "left out to fit 160 columns" in narrow.stdout and "--json has all" in narrow.stdout
    assert max(len(ln) for ln in narrow.stdout.splitlines()) <= 160


def test_port_in_use_says_which_and_how_to_choose_another(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = cli("server", "--home", str(tmp_path / "h"), "--port", str(port))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "Errno" not in r.stderr + r.stdout
    assert f"port {port} on 127.0.0.1 is already in use" in r.stderr and "--port N" in r.stderr
    assert "control plane at" not in r.stdout  # no URL announced for a server that cannot start


@pytest.mark.parametrize(
    "args,option,bound",
    [
        (["server", "--port", "99999"], "--port", "65535"),  # was an OverflowError traceback from bind()
        # was "packs to more than -1 bytes: ... raise the limit"
        (["enqueue", "-q", "gpu", "--code", ".", "--code-limit", "-1", "--", "true"], "--code-limit", "1"),
    ],
)
def test_a_number_out_of_range_is_a_usage_error(tmp_path: Path, args: list[str], option: str, bound: str) -> None:
    r = cli(args[0], "--home", str(tmp_path / "h"), *args[1:])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"Invalid value for '{option}'" in r.stderr and bound in r.stderr


def test_help_does_not_label_flags_bool() -> None:
    r = cli("queues", "--help", env={"COLUMNS": "120"})
    assert r.returncode == 0 and "--json" in r.stdout and "<bool>" not in r.stdout
    assert "<str>" in r.stdout  # options that take a value still say what kind
