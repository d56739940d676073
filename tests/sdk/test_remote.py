"""`run_remotely` and the Task handle end to end: a real server, a real agent process
running the task, and the script started as a user starts it (`python train.py`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autoscaler.artifacts.store import LocalStore
from autoscaler.lifecycle import TASK_FINAL
from autoscaler.sdk import Client
from tests.agent.conftest import PY, AgentHarness, py
from tests.conftest import REPO, free_port, issue_token

TRAIN = """\
import os, sys
from autoscaler.sdk import run_remotely

run_remotely(queue="gpu", gpus=1, team="vision"{extra})
# Only the worker gets here.
print("worker ran", os.path.abspath(__file__), sys.argv[1:], os.environ["AUTOSCALER_TASK_ID"], flush=True)
print("gpu", os.environ.get("CUDA_VISIBLE_DEVICES"), file=sys.stderr, flush=True)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
"""


def write_script(root: Path, extra: str = "") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    script = root / "train.py"
    script.write_text(TRAIN.format(extra=extra))
    return script


def submit_side(
    harness: AgentHarness, script: Path, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python train.py ARGS` as a user runs it on their laptop: not inside a task."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    environ.update(
        {
            "PYTHONPATH": str(REPO),
            "AUTOSCALER_SERVER": harness.server.url,
            "AUTOSCALER_TOKEN": issue_token(harness.ctx, "admin"),
            **(env or {}),
        }
    )
    return subprocess.run(
        [PY, str(script), *args], capture_output=True, text=True, env=environ, cwd=cwd or script.parent, timeout=60
    )


def test_python_train_py_enqueues_itself_and_the_sdk_returns_the_workers_output(
    harness: AgentHarness, tmp_path: Path
) -> None:
    harness.start_agent(gpus=1)
    script = write_script(tmp_path / "project")
    # Started from another directory, with arguments: the task runs the same file with the same ones.
    done = submit_side(harness, script, "--epochs", "2", "a b", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 1, done.stdout  # the task id, and nothing the worker part prints
    task_id = lines[0]
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        task = client.task(task_id)
        # Waited for in the harness first: a timeout there shows the task's history and the agent's log.
        harness.wait_state(task_id, *TASK_FINAL, timeout=30)
        info = task.wait(timeout=5, poll_s=0.2)
        assert info.state == "succeeded" and info.exit_code == 0, harness.agents[0].log()
        assert info.command == [PY, "train.py", "--epochs", "2", "a b"]
        assert info.working_dir == str(script.parent)
        assert task.output("stdout") == f"worker ran {script} ['--epochs', '2', 'a b'] {task_id}\n"
        assert task.output("stderr") == "gpu 0\n"
        followed = list(task.logs(follow=True))
        assert "".join(c.data for c in followed if c.stream == "stdout") == task.output("stdout")


def test_follow_streams_the_output_and_exits_with_the_tasks_exit_code(harness: AgentHarness, tmp_path: Path) -> None:
    harness.start_agent(gpus=1)
    script = write_script(tmp_path / "project", extra=", follow=True, max_attempts=1, env={'EXIT_WITH': '3'}")
    done = submit_side(harness, script, "x")
    assert done.returncode == 3, done.stderr
    task_id, worker_line = done.stdout.splitlines()
    assert worker_line == f"worker ran {script} ['x'] {task_id}"
    assert "gpu 0" in done.stderr
    assert harness.task(task_id)["state"] == "failed"
    assert done.stderr.splitlines()[-1].startswith(f"error: task {task_id} failed (exit 3): max_attempts reached")


def test_follow_says_why_a_task_that_never_started_failed(harness: AgentHarness, tmp_path: Path) -> None:
    harness.start_agent(gpus=1)
    script = write_script(tmp_path / "project", extra=", follow=True, python='/no/such/python'")
    done = submit_side(harness, script)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    task_id = done.stdout.strip()
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"error: task {task_id} failed (start_failed): ") and "/no/such/python" in last
    assert f"autoscaler task show {task_id}" in last


def test_logs_follow_yields_output_while_the_task_runs_and_stops_when_it_ends(harness: AgentHarness) -> None:
    harness.start_agent(gpus=1)
    code = "import time\nfor i in range(3):\n    print('step', i, flush=True)\n    time.sleep(0.5)\n"
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        task = client.submit(py(code), queue="gpu", gpus=1, team="vision")
        seen = "".join(c.data for c in task.logs(follow=True, poll_s=0.1))
        assert seen == "step 0\nstep 1\nstep 2\n"
        assert task.info().state == "succeeded"


def test_errors_on_the_submitting_side_are_one_line_and_exit_1(harness: AgentHarness, tmp_path: Path) -> None:
    script = write_script(tmp_path / "project")
    down = submit_side(harness, script, env={"AUTOSCALER_SERVER": f"http://127.0.0.1:{free_port()}"})
    assert down.returncode == 1 and down.stdout == ""
    assert down.stderr.startswith("error: cannot reach the server at") and "Traceback" not in down.stderr
    bad_queue = write_script(tmp_path / "other", extra=", priority=5000")
    refused = submit_side(harness, bad_queue)
    assert refused.returncode == 1 and refused.stderr.startswith("error: 422: invalid request: body.priority")
    misspelt = submit_side(harness, write_script(tmp_path / "third", extra=", gpu_count=1"))
    assert misspelt.returncode == 1 and misspelt.stderr.startswith("error: unknown task option 'gpu_count'")
    inline = subprocess.run(
        [PY, "-c", "from autoscaler.sdk import run_remotely; run_remotely(queue='gpu')"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), "AUTOSCALER_SERVER": harness.server.url},
        timeout=60,
    )
    assert inline.returncode == 1 and "needs a script file" in inline.stderr and "Traceback" not in inline.stderr
    assert harness.admin.get("/api/v1/tasks").json() == []  # nothing was enqueued by any of them


def test_it_takes_checkpoints_and_the_expected_run_time_as_the_cli_does(harness: AgentHarness, tmp_path: Path) -> None:
    # No agent: the task stays queued, and what the server kept is what the CLI sends.
    script = write_script(tmp_path / "project", extra=', checkpoints="on-signal", expected_runtime="6h"')
    done = submit_side(harness, script)
    assert done.returncode == 0, done.stderr
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        info = client.task(done.stdout.strip()).info()
    assert info.checkpoints == "on-signal" and info.expected_runtime_s == 6 * 3600
    assert info.raw["runtime_estimate"]["source"] == "declared"
    # A typo in an option, or a duration it cannot read: one line, exit 1, nothing enqueued.
    typo = submit_side(harness, write_script(tmp_path / "typo", extra=', checkpoint="on-signal"'))
    assert typo.returncode == 1 and typo.stderr.startswith("error: unknown task option 'checkpoint':")
    bad = submit_side(harness, write_script(tmp_path / "bad", extra=', expected_runtime="six hours"'))
    assert bad.returncode == 1 and "is not a duration; use e.g. 90s, 45m, 6h" in bad.stderr
    assert "Traceback" not in typo.stderr + bad.stderr
    assert len(harness.admin.get("/api/v1/tasks").json()) == 1


def test_on_a_worker_it_returns_and_enqueues_nothing(harness: AgentHarness, tmp_path: Path) -> None:
    script = write_script(tmp_path / "project")
    done = submit_side(harness, script, env={"AUTOSCALER_TASK_ID": "t-already-here"})
    assert done.returncode == 0 and done.stdout.startswith("worker ran")
    assert harness.admin.get("/api/v1/tasks").json() == []


def test_snapshot_mode_runs_code_that_exists_only_on_the_submitting_side(harness: AgentHarness, tmp_path: Path) -> None:
    """code='snapshot': the script's directory is packed and uploaded; the worker runs
    the unpacked copy in its own scratch dir, after the original is gone."""
    harness.ctx.artifacts = LocalStore(tmp_path / "store")
    harness.start_agent(gpus=1)
    project = tmp_path / "project"
    # The worker's interpreter (default `python3` for a snapshot) is this one here.
    script = write_script(project, extra=f", code='snapshot', python={PY!r}")
    (project / "data.txt").write_text("only on the laptop\n")
    script.write_text(
        script.read_text().replace("sys.exit(", "print(open('data.txt').read().strip(), flush=True)\nsys.exit(")
    )
    done = submit_side(harness, script, "e1")
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    shutil.rmtree(project)  # from here on the code exists only in the store
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        task = client.task(task_id)
        info = task.wait(timeout=60, poll_s=0.2)
        assert info.state == "succeeded", harness.agents[0].log()
        assert info.working_dir is None and info.raw["code"]["snapshot"].startswith("sha256:")
        out = task.output("stdout").splitlines()
        assert out[0].startswith("worker ran ") and "['e1']" in out[0] and str(project) not in out[0]
        assert out[1] == "only on the laptop"


def test_snapshot_mode_against_a_server_without_a_store_says_so_and_enqueues_nothing(
    harness: AgentHarness, tmp_path: Path
) -> None:
    harness.ctx.artifacts = None
    script = write_script(tmp_path / "project", extra=", code='snapshot'")
    done = submit_side(harness, script)
    assert done.returncode == 1 and "Traceback" not in done.stderr and done.stderr.startswith("error: ")
    assert harness.admin.get("/api/v1/tasks").json() == []


def test_the_sdk_is_importable_without_the_server_stack() -> None:
    """A laptop needs httpx and pydantic only: importing the SDK loads no server module."""
    code = (
        "import sys, autoscaler.sdk\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('sqlalchemy', 'fastapi', 'uvicorn')"
        " or m.startswith(('autoscaler.api', 'autoscaler.state', 'autoscaler.agent'))]\n"
        "print(bad)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_the_shipped_example_runs_as_is_and_its_output_comes_back(harness: AgentHarness, tmp_path: Path) -> None:
    """examples/laptop-to-gpu/train.py, unchanged, as docs/laptop-to-gpu.md runs it."""
    harness.start_agent(gpus=1)
    example = REPO / "examples" / "laptop-to-gpu" / "train.py"
    done = submit_side(harness, example, "--epochs", "4", env={"FOLLOW": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    task_id, *printed = done.stdout.splitlines()
    assert printed[0].startswith(f"task {task_id} on ") and printed[0].endswith("GPUs '0'")
    epochs = [line for line in printed if line.startswith("epoch ")]
    assert [line.split()[1] for line in epochs] == ["1/4", "2/4", "3/4", "4/4"]
    losses = [float(line.split()[-1]) for line in epochs]
    assert losses == sorted(losses, reverse=True)  # it trains: the loss goes down
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        assert client.task(task_id).output("stdout").splitlines() == printed


def test_a_module_run_with_dash_m_is_run_the_same_way_on_the_worker(harness: AgentHarness, tmp_path: Path) -> None:
    harness.start_agent(gpus=1)
    package = tmp_path / "project" / "trainer"
    write_script(package)  # trainer/train.py
    (package / "__init__.py").write_text("")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AUTOSCALER_")}
    environ.update(
        {
            "PYTHONPATH": str(REPO),
            "AUTOSCALER_SERVER": harness.server.url,
            "AUTOSCALER_TOKEN": issue_token(harness.ctx, "admin"),
        }
    )
    done = subprocess.run(
        [PY, "-m", "trainer.train", "--lr", "1"],
        capture_output=True,
        text=True,
        env=environ,
        cwd=tmp_path / "project",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        harness.wait_state(task_id, *TASK_FINAL, timeout=30)
        info = client.task(task_id).wait(timeout=5, poll_s=0.2)
        assert info.command == [PY, "-m", "trainer.train", "--lr", "1"]
        assert info.working_dir == str(tmp_path / "project") and info.state == "succeeded"
        assert client.task(task_id).output("stdout").startswith(f"worker ran {package / 'train.py'} ['--lr', '1']")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_git_mode_runs_the_committed_code_with_the_uncommitted_diff_on_the_worker(
    harness: AgentHarness, tmp_path: Path
) -> None:
    """code='git': the worker clones the checkout's origin at its HEAD and applies the
    uncommitted diff; the laptop's checkout is gone before the task runs, and a file
    that was never committed (untracked) does not reach the worker."""
    harness.ctx.artifacts = LocalStore(tmp_path / "store")
    origin = tmp_path / "origin.git"
    repo = tmp_path / "laptop"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(origin))
    _git(tmp_path, "clone", "-q", str(origin), str(repo))
    for k, v in (("user.email", "t@example.com"), ("user.name", "t")):
        _git(repo, "config", k, v)
    # The script is in a subdirectory of the checkout, as training scripts often are.
    script = write_script(repo / "jobs", extra=f", code='git', python={PY!r}")
    script.write_text(
        script.read_text().replace(
            "sys.exit(",
            "here = os.path.dirname(os.path.abspath(__file__))\n"
            "print('committed:', open(os.path.join(here, 'committed.txt')).read().strip(), flush=True)\n"
            "print('edited:', open(os.path.join(here, 'edited.txt')).read().strip(), flush=True)\n"
            "print('untracked present:', os.path.exists(os.path.join(here, 'untracked.txt')), flush=True)\n"
            "sys.exit(",
        )
    )
    (repo / "jobs" / "committed.txt").write_text("from the commit\n")
    (repo / "jobs" / "edited.txt").write_text("as committed\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "v1")
    _git(repo, "push", "-q", "origin", "main")
    commit = _git(repo, "rev-parse", "HEAD")
    (repo / "jobs" / "edited.txt").write_text("edited on the laptop, not committed\n")  # the uncommitted diff
    (repo / "jobs" / "untracked.txt").write_text("never added\n")
    harness.start_agent(gpus=1)

    done = submit_side(harness, script, "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    task_id = done.stdout.strip()
    shutil.rmtree(repo)  # from here on the code is in origin and the diff in the store
    with Client(harness.server.url, issue_token(harness.ctx, "admin")) as client:
        task = client.task(task_id)
        info = task.wait(timeout=60, poll_s=0.2)
        assert info.state == "succeeded", (task.output(), harness.agents[0].log())
        code = info.raw["code"]
        assert code["git"] == str(origin) and code["ref"] == commit and code["diff_snapshot"].startswith("sha256:")
        assert info.working_dir is None and info.command == [PY, "jobs/train.py", "--lr", "0.1"]
        out = task.output("stdout").splitlines()
        assert out[0].startswith("worker ran ") and out[0].endswith(f"['--lr', '0.1'] {task_id}"), out
        assert str(repo) not in out[0] and "/jobs/train.py" in out[0]  # the clone's copy of the same file
        assert out[1:] == [
            "committed: from the commit",
            "edited: edited on the laptop, not committed",
            "untracked present: False",
        ]
        assert "with the uncommitted diff" in task.output("stderr")


def test_git_mode_names_a_script_by_its_path_in_the_checkout_and_refuses_a_module_below_the_top() -> None:
    from autoscaler.sdk.errors import SdkError
    from autoscaler.sdk.remote import Entry, in_clone

    assert in_clone(Entry(["train.py", "-x"], Path("/r")), "") == ["train.py", "-x"]
    assert in_clone(Entry(["train.py", "-x"], Path("/r/jobs")), "jobs/") == ["jobs/train.py", "-x"]
    assert in_clone(Entry(["-m", "pkg.train"], Path("/r")), "") == ["-m", "pkg.train"]
    with pytest.raises(SdkError, match="start it from the top, or use code='snapshot'"):
        in_clone(Entry(["-m", "pkg.train"], Path("/r/src")), "src/")
