"""Tasks that carry their code, setup, outputs and checkpoints, end to end: real agent
processes against the real server with a local artifact store; spot notices from the
fake metadata service. The code exists only on the submitting side (a tmp dir the
agents never see: it is packed, uploaded and deleted before the task runs)."""

from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.artifacts.records import snapshot_key
from tests.agent.carrying import artifact, reclaim, spot_flags, spot_metadata, upload_dir, vision
from tests.agent.conftest import PY, AgentHarness, wait_for
from tests.fakes.stores import STORES, azurite, gcs_url, moto_s3, open_test_store  # noqa: F401 - fixtures


@pytest.fixture(params=STORES)
def carry(request: pytest.FixtureRequest, harness: AgentHarness, tmp_path: Path) -> Iterator[AgentHarness]:
    """The harness with an artifact store: the local one, or a bucket on moto's S3, the
    GCS emulator or Azurite (workers then download straight from the bucket on signed URLs)."""
    harness.ctx.artifacts = open_test_store(request, request.param, tmp_path)
    yield harness


def test_snapshot_code_runs_after_its_setup_and_its_outputs_are_downloadable(
    carry: AgentHarness, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "main.py").write_text(
        "import os, pkg.lib\n"
        "print('setup said', open('setup.txt').read().strip())\n"
        "print('ignored file present:', os.path.exists('big.bin'))\n"
        "os.makedirs('out/plots', exist_ok=True)\n"
        "open('out/result.txt', 'w').write(pkg.lib.answer())\n"
        "open('out/plots/a.txt', 'w').write('plot')\n"
    )
    (src / "pkg" / "__init__.py").write_text("")
    (src / "pkg" / "lib.py").write_text("def answer():\n    return '42\\n'\n")
    (src / "big.bin").write_bytes(b"x" * 1000)
    (src / ".gitignore").write_text("*.bin\n")
    digest = upload_dir(carry, src)

    task = carry.enqueue(
        [PY, "main.py"],
        code={"snapshot": digest},
        setup="echo from-setup > setup.txt; echo setup-output",
        outputs=["out/result.txt", "out/plots", "out/missing.txt"],
    )
    carry.start_agent()
    done = carry.wait_state(task, "succeeded", "failed")
    out = carry.logs(task)
    assert done["state"] == "succeeded", out
    assert "setup said from-setup" in out and "ignored file present: False" in out
    assert out.index("setup-output") < out.index("setup said")  # setup ran first
    assert "out/missing.txt: not found" in out
    assert artifact(carry, task, "out/result.txt") == b"42\n"
    with tarfile.open(fileobj=io.BytesIO(artifact(carry, task, "out/plots.tar.gz"))) as tar:
        member = tar.extractfile("a.txt")
        assert member is not None and member.read() == b"plot"
    listed = vision(carry).get(f"/api/v1/tasks/{task}/artifacts").json()
    result = next(a for a in listed if a["name"] == "out/result.txt")
    assert result == {**result, "kind": "output", "size": 3, "attempt": 1}
    assert result["digest"] == "sha256:" + hashlib.sha256(b"42\n").hexdigest()


def test_a_failing_setup_ends_the_attempt_with_its_reason_and_the_command_never_runs(
    carry: AgentHarness, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text("open('ran', 'w')\n")
    digest = upload_dir(carry, src)
    task = carry.enqueue(
        [PY, "main.py"],
        code={"snapshot": digest},
        setup="echo installing; exit 3",
        outputs=["ran"],
        max_attempts=1,
    )
    carry.start_agent()
    done = carry.wait_state(task, "failed")
    assert done["end_reason"] == "start_failed"
    assert "setup 'echo installing; exit 3' failed (exit code 3)" in done["events"][-1]["detail"], done["events"]
    out = carry.logs(task)
    assert "installing" in out and "ran: not found" not in out  # outputs of a command that never ran: none
    assert vision(carry).get(f"/api/v1/tasks/{task}/artifacts").json() == []


def test_a_snapshot_changed_in_the_store_fails_the_integrity_check(carry: AgentHarness, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text("print('must not run')\n")
    digest = upload_dir(carry, src)
    store = carry.ctx.artifacts
    assert store is not None
    key = snapshot_key("vision", digest)  # the object changes in the store behind the server's back
    store.put(key, [b"".join(store.get(key)) + b"tampered"])
    task = carry.enqueue([PY, "main.py"], code={"snapshot": digest}, max_attempts=1)
    carry.start_agent()
    done = carry.wait_state(task, "failed")
    assert "integrity check failed" in done["events"][-1]["detail"]
    assert "must not run" not in carry.logs(task)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def test_git_code_at_a_ref_with_the_uncommitted_diff(carry: AgentHarness, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "config", "user.email", "t@example.com")
    git(repo, "config", "user.name", "t")
    (repo / "main.py").write_text("print('version', 1)\n")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "v1")
    commit = git(repo, "rev-parse", "HEAD")
    (repo / "main.py").write_text("print('version', 2)\n")
    git(repo, "commit", "-qam", "v2")  # the ref asked for is the older commit
    (repo / "main.py").write_text("print('version', 1, 'plus local edit')\n")
    diff = subprocess.run(["git", "diff", commit, "--binary"], cwd=repo, check=True, capture_output=True).stdout
    patch = tmp_path / "patch"
    patch.mkdir()
    (patch / "diff.patch").write_bytes(diff)
    diff_digest = upload_dir(carry, patch)
    task = carry.enqueue([PY, "main.py"], code={"git": f"file://{repo}", "ref": commit, "diff_snapshot": diff_digest})
    carry.start_agent()
    done = carry.wait_state(task, "succeeded", "failed")
    assert done["state"] == "succeeded", carry.logs(task)
    assert "version 1 plus local edit" in carry.logs(task, "stdout")


# Counts steps in its checkpoint dir; on SIGTERM it saves where it is and exits.
RESUMING = """
import os, signal, sys, time
os.makedirs('ckpt', exist_ok=True)
step = int(open('ckpt/step').read()) if os.path.exists('ckpt/step') else 0
print('starting at step', step, 'attempt', os.environ['AUTOSCALER_TASK_ATTEMPT'], flush=True)
def save(*_):
    with open('ckpt/step.tmp', 'w') as f:
        f.write(str(step))
    os.replace('ckpt/step.tmp', 'ckpt/step')
def stop(*_):
    save()
    print('checkpointed at step', step, flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while step < 40:
    step += 1
    if step % 5 == 0:
        save()
    time.sleep(0.1)
os.makedirs('out', exist_ok=True)
open('out/final.txt', 'w').write(f'finished at step {step}\\n')
print('done at step', step, flush=True)
"""


def test_a_spot_reclaimed_task_resumes_from_its_checkpoint_on_another_agent(
    carry: AgentHarness, tmp_path: Path
) -> None:
    with spot_metadata() as metadata:
        task = carry.enqueue([PY, "-c", RESUMING], checkpoint_dir="ckpt", outputs=["out/final.txt"])
        spot = carry.start_agent(instance_id="", extra=spot_flags(metadata))
        carry.wait_state(task, "running")
        reached = reclaim(carry, task, metadata, spot, timeout=30)

        carry.start_agent(instance_id="i-replacement")
        done = carry.wait_state(task, "succeeded", timeout=40)
        out = carry.logs(task)
        assert done["attempts"] == 2, out
        # It continued from the checkpoint's content, not from zero.
        assert f"starting at step {reached} attempt 2" in out, out
        assert artifact(carry, task, "out/final.txt") == b"finished at step 40\n"
        kinds = {(a["name"], a["attempt"]) for a in vision(carry).get(f"/api/v1/tasks/{task}/artifacts").json()}
        assert ("checkpoint.tar.gz", 1) in kinds and ("out/final.txt", 2) in kinds


RANGE = "64120-64135"


def test_unprivileged_tasks_own_their_unpacked_code_and_cannot_leak_files_through_links(
    carry: AgentHarness, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.sh").write_text(
        "id -u\nstat -c 'owner %u' main.sh .\nmkdir -p out && echo written > out/mine.txt\nln -s /etc/shadow out/leak\n"
    )
    digest = upload_dir(carry, src)
    # Not under pytest's tmp dir: a task user must be able to pass through the work dir's parents.
    work = Path("/tmp") / f"autoscaler-carry-{tmp_path.name}"
    carry.start_agent(root_tasks=False, extra=["--run-as-range", RANGE, "--work-dir", str(work)])
    try:
        task = carry.enqueue(["/bin/sh", "main.sh"], code={"snapshot": digest}, outputs=["out/mine.txt", "out/leak"])
        done = carry.wait_state(task, "succeeded", "failed", timeout=30)
        out = carry.logs(task)
        assert done["state"] == "succeeded", out
        uid = int(carry.logs(task, "stdout").split()[0])
        assert uid >= 64120 and f"owner {uid}" in out and "owner 0" not in out, out
        assert artifact(carry, task, "out/mine.txt") == b"written\n"
        assert "out/leak: a symlink; not followed" in out
        names = {a["name"] for a in vision(carry).get(f"/api/v1/tasks/{task}/artifacts").json()}
        assert names == {"out/mine.txt"}
    finally:
        shutil.rmtree(work, ignore_errors=True)


# Never checkpoints on SIGTERM: only the agent's periodic uploads can save it.
PERIODIC = """
import os, time
os.makedirs('ckpt', exist_ok=True)
step = int(open('ckpt/step').read()) if os.path.exists('ckpt/step') else 0
print('starting at step', step, 'attempt', os.environ['AUTOSCALER_TASK_ATTEMPT'], flush=True)
if os.environ['AUTOSCALER_TASK_ATTEMPT'] != '1':
    raise SystemExit(0)
while True:
    step += 1
    with open('ckpt/step.tmp', 'w') as f:
        f.write(str(step))
    os.replace('ckpt/step.tmp', 'ckpt/step')
    time.sleep(0.2)
"""


def test_a_machine_lost_without_notice_resumes_from_the_last_periodic_checkpoint(carry: AgentHarness) -> None:
    task = carry.enqueue([PY, "-c", PERIODIC], checkpoint_dir="ckpt", checkpoint_every_s=10)
    doomed = carry.start_agent(instance_id="i-doomed")
    carry.wait_state(task, "running")
    wait_for("a periodic checkpoint", lambda: "checkpoint: saved ckpt" in carry.logs(task), timeout=30)
    doomed.proc.kill()  # kill -9: no notice, no final upload
    doomed.proc.wait(5)
    wait_for("the worker to be expired", lambda: carry.expire_silent(1.0), timeout=10, every=0.2)
    listed = vision(carry).get(f"/api/v1/tasks/{task}/artifacts").json()
    assert [(a["kind"], a["attempt"]) for a in listed] == [("checkpoint", 1)]

    carry.start_agent(instance_id="i-survivor")
    done = carry.wait_state(task, "succeeded", timeout=30)
    out = carry.logs(task)
    resumed = int(out.split("starting at step ")[2].split()[0])
    assert done["attempts"] == 2 and resumed > 0, out  # the periodic upload's step, not zero
