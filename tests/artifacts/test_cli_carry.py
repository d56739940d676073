"""`autoscaler enqueue --code/--setup/--output/--checkpoint-dir` and `autoscaler
artifacts` as a user runs them: a real server process (its default local store under
HOME), a real agent process, the CLI as subprocesses."""

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

from tests.agent.conftest import FAST
from tests.conftest import REPO, TEST_CONFIG, free_port
from tests.test_cli import cli


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("carry-cli")
    (tmp / "autoscaler.yaml").write_text(TEST_CONFIG)
    home = tmp / "home"
    port = free_port()
    cmd = [sys.executable, "-m", "autoscaler", "server", "--config", str(tmp / "autoscaler.yaml")]
    proc = subprocess.Popen([*cmd, "--home", str(home), "--port", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
        time.sleep(0.2)
    env = {"AUTOSCALER_SERVER": url, "AUTOSCALER_HOME": str(home), "AUTOSCALER_TOKEN": ""}
    join = cli("token", "create", "--join", "--pool", "cpu-pool", env=env).stdout.strip()
    agent_cmd = [sys.executable, "-m", "autoscaler", "agent", "--work-dir", str(tmp / "work"), *FAST]
    agent_cmd += ["--state-dir", str(tmp / "state"), "--server", url, "--pool", "cpu-pool"]
    agent_cmd += ["--provider", "static", "--instance-id", "i-carry-cli", "--run-as", "root", "--allow-root-tasks"]
    agent = subprocess.Popen(
        agent_cmd,
        env={**os.environ, "AUTOSCALER_JOIN_TOKEN": join, "PYTHONPATH": str(REPO)},
        stdout=(tmp / "agent.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    vision = cli("token", "create", "--team", "vision", env=env).stdout.strip()
    yield {**env, "AUTOSCALER_TOKEN": vision, "TMP": str(tmp)}
    for p in (agent, proc):
        p.terminate()
        p.wait(timeout=20)


def wait_done(env: dict[str, str], task_id: str) -> dict[str, object]:
    deadline = time.monotonic() + 40
    while True:
        shown: dict[str, object] = json.loads(cli("task", "show", task_id, "--json", env=env).stdout)
        if shown["state"] in ("succeeded", "failed"):
            return shown
        assert time.monotonic() < deadline, shown
        time.sleep(0.3)


def test_code_dir_setup_and_outputs_through_the_cli(server: dict[str, str], tmp_path: Path) -> None:
    src = tmp_path / "project"
    src.mkdir()
    (src / "train.py").write_text(
        "import os\nos.makedirs('out', exist_ok=True)\n"
        "open('out/model.txt', 'w').write('weights from ' + open('deps.txt').read())\n"
    )
    (src / "data.cache").write_text("never sent")
    (src / ".gitignore").write_text("*.cache\n")
    r = cli(
        "enqueue", "-q", "cpu", "--code", str(src), "--setup", "echo deps-installed > deps.txt",
        "--output", "out/model.txt", "--checkpoint-dir", "ckpt", "--", sys.executable, "train.py",
        env=server,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "uploaded as sha256:" in r.stderr
    task_id = r.stdout.strip()
    done = wait_done(server, task_id)
    assert done["state"] == "succeeded", cli("logs", task_id, env=server).stdout
    assert done["code"] == {"snapshot": r.stderr.split("uploaded as ")[1].split()[0]}

    listed = cli("artifacts", task_id, "--json", env=server)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(a["name"], a["kind"]) for a in rows] == [("out/model.txt", "output")]
    table = cli("artifacts", task_id, env={**server, "COLUMNS": "200"})
    assert "out/model.txt" in table.stdout and rows[0]["digest"] in table.stdout
    dest = tmp_path / "got"
    dl = cli("artifacts", task_id, "--download", str(dest), env=server)
    assert dl.returncode == 0, dl.stderr
    assert (dest / "out" / "model.txt").read_text() == "weights from deps-installed\n"

    nlp = cli("token", "create", "--team", "nlp", env={**server, "AUTOSCALER_TOKEN": ""}).stdout.strip()
    assert nlp.startswith("ast_")
    other = {**server, "AUTOSCALER_TOKEN": nlp}
    hidden = cli("artifacts", task_id, env=other)
    assert hidden.returncode == 1 and "not found" in hidden.stderr


def test_cli_refusals_are_one_line(server: dict[str, str], tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "blob").write_bytes(os.urandom(200_000))
    r = cli("enqueue", "-q", "cpu", "--code", str(big), "--code-limit", "1000", "--", "true", env=server)
    assert r.returncode == 1 and "more than 1000 bytes" in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cli("enqueue", "-q", "cpu", "--code", str(big), "--git", "https://example.invalid/x", "--", "true", env=server)
    assert r.returncode == 1 and "not both" in r.stderr
    r = cli("enqueue", "-q", "cpu", "--output", "../etc", "--", "true", env=server)
    assert r.returncode == 1 and "inside the task's directory" in r.stderr
    r = cli("enqueue", "-q", "cpu", "--code", str(tmp_path / "nope"), "--", "true", env=server)
    assert r.returncode == 1 and "not a directory" in r.stderr


def test_code_from_a_subdirectory_of_a_checkout_says_where_the_task_runs(
    server: dict[str, str], tmp_path: Path
) -> None:
    def git(cwd: Path, *args: str) -> None:
        subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)

    origin, repo = tmp_path / "origin.git", tmp_path / "repo"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    git(tmp_path, "clone", "-q", str(origin), str(repo))
    (repo / "jobs").mkdir()
    (repo / "jobs" / "run.sh").write_text("cat jobs/data.txt\n")
    (repo / "jobs" / "data.txt").write_text("from the top\n")
    git(repo, "add", ".")
    git(repo, "-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "v1")
    git(repo, "push", "-q", "origin", "main")
    r = cli("enqueue", "-q", "cpu", "--code", str(repo / "jobs"), "--", "sh", "jobs/run.sh", env=server)
    assert r.returncode == 0, r.stderr
    assert "runs at the top of the clone" in r.stderr and "is jobs/" in r.stderr
    task_id = r.stdout.strip()
    done = wait_done(server, task_id)
    assert done["state"] == "succeeded", done
    logs = cli("logs", task_id, env=server)
    assert "from the top" in logs.stdout
    top = cli("enqueue", "-q", "cpu", "--code", str(repo), "--", "true", env=server)
    assert top.returncode == 0 and "top of the clone" not in top.stderr
