"""Container tasks that carry files, end to end: real agents pull a busybox image from
a real local registry and run it with rootful podman (runc), as the unprivileged task
user; the code comes from a snapshot that exists only in the artifact store, the setup
runs inside the same container before the command, outputs and checkpoints are stored
from the host after the container exits, and a spot-reclaimed container task resumes
from its checkpoint on another agent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.artifacts.store import LocalStore
from tests.agent.carrying import reclaim, spot_flags, spot_metadata, upload_dir, vision
from tests.agent.conftest import AgentHarness, AgentProcess
from tests.agent.oci import IMAGE_MARKER, Oci, oci_setup


@pytest.fixture(scope="module")
def oci(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oci]:
    with oci_setup(tmp_path_factory.mktemp("oci")) as o:
        yield o


@pytest.fixture
def boxed(harness: AgentHarness, oci: Oci, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> AgentHarness:
    """The harness with a local artifact store; agents inherit podman's configuration."""
    for k, v in oci.env.items():
        monkeypatch.setenv(k, v)
    harness.ctx.artifacts = LocalStore(tmp_path / "store")
    return harness


def unprivileged_agent(h: AgentHarness, extra: list[str] | None = None, **kw: object) -> AgentProcess:
    return h.start_agent(gpus=0, root_tasks=False, extra=["--run-as", "nobody", *(extra or [])], **kw)  # type: ignore[arg-type]


def test_snapshot_code_runs_in_the_container_after_its_setup_there_and_its_outputs_are_stored(
    boxed: AgentHarness, oci: Oci, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "main.sh").write_text(
        "cat /image-marker\n"
        "echo uid=$(id -u) cwd=$(pwd)\n"
        # /tmp is the container's own: only a setup in this same container could have written it.
        "echo installed=$(cat /tmp/installed)\n"
        ". ./lib/answer.sh\n"
        "mkdir -p out/plots && echo $ANSWER > out/result.txt && echo plot > out/plots/a.txt\n"
    )
    (src / "lib" / "answer.sh").write_text("ANSWER=42\n")
    digest = upload_dir(boxed, src)
    task = boxed.enqueue(
        ["sh", "main.sh"],
        gpus=0,
        image=oci.image,
        code={"snapshot": digest},
        setup="echo setup-output; echo from-setup > /tmp/installed",
        outputs=["out/result.txt", "out/plots", "out/missing.txt"],
    )
    unprivileged_agent(boxed)
    done = boxed.wait_state(task, "succeeded", "failed", timeout=60)
    out, stdout = boxed.logs(task), boxed.logs(task, "stdout")
    assert done["state"] == "succeeded", out
    assert IMAGE_MARKER in stdout and "uid=65534 cwd=/workspace" in stdout  # in the image, as the task user
    assert "installed=from-setup" in stdout  # the setup ran in the same container
    assert stdout.index("setup-output") < stdout.index(IMAGE_MARKER)  # and before the command
    assert "[autoscaler agent: setup: echo setup-output" in out and "out/missing.txt: not found" in out
    r = vision(boxed).get(f"/api/v1/tasks/{task}/artifacts/out/result.txt")
    assert r.status_code == 200 and r.content == b"42\n"
    names = {a["name"] for a in vision(boxed).get(f"/api/v1/tasks/{task}/artifacts").json()}
    assert names == {"out/result.txt", "out/plots.tar.gz"}
    assert oci.containers(f"autoscaler-{task}") == []


def test_a_failing_setup_in_the_container_ends_the_attempt_with_its_reason(
    boxed: AgentHarness, oci: Oci, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.sh").write_text("echo the-command-ran > ran\n")
    digest = upload_dir(boxed, src)
    task = boxed.enqueue(
        ["sh", "main.sh"],
        gpus=0,
        image=oci.image,
        code={"snapshot": digest},
        setup="echo installing; exit 3",
        outputs=["ran"],
        max_attempts=1,
    )
    unprivileged_agent(boxed)
    done = boxed.wait_state(task, "failed", timeout=60)
    assert done["end_reason"] == "start_failed", done
    assert "setup 'echo installing; exit 3' failed (exit code 3)" in done["events"][-1]["detail"], done["events"]
    out = boxed.logs(task)
    assert "installing" in out and "the-command-ran" not in out and "ran: not found" not in out
    assert vision(boxed).get(f"/api/v1/tasks/{task}/artifacts").json() == []


def test_a_command_failing_after_a_good_setup_is_the_task_failing_not_a_setup_failure(
    boxed: AgentHarness, oci: Oci
) -> None:
    task = boxed.enqueue(
        ["sh", "-c", "echo partial > part.txt; exit 5"],
        gpus=0,
        image=oci.image,
        setup="true",
        outputs=["part.txt"],
        max_attempts=1,
    )
    unprivileged_agent(boxed)
    done = boxed.wait_state(task, "failed", timeout=60)
    assert done["end_reason"] != "start_failed" and done["exit_code"] == 5, done
    r = vision(boxed).get(f"/api/v1/tasks/{task}/artifacts/part.txt")
    assert r.status_code == 200 and r.content == b"partial\n"  # outputs of any end are stored


# Counts steps in its checkpoint dir; on SIGTERM (delivered into the container) it
# saves where it is and exits.
RESUMING = """
mkdir -p ckpt
step=0
[ -f ckpt/step ] && step=$(cat ckpt/step)
echo "starting at step $step attempt $AUTOSCALER_TASK_ATTEMPT"
trap 'echo $step > ckpt/step.tmp; mv ckpt/step.tmp ckpt/step; echo "checkpointed at step $step"; exit 0' TERM
while [ "$step" -lt 40 ]; do step=$((step + 1)); sleep 0.1; done
mkdir -p out
echo "finished at step $step" > out/final.txt
echo "done at step $step"
"""


def test_a_spot_reclaimed_container_task_resumes_from_its_checkpoint_on_another_agent(
    boxed: AgentHarness, oci: Oci
) -> None:
    with spot_metadata() as metadata:
        task = boxed.enqueue(
            ["sh", "-c", RESUMING], gpus=0, image=oci.image, checkpoint_dir="ckpt", outputs=["out/final.txt"]
        )
        spot = unprivileged_agent(boxed, extra=spot_flags(metadata), instance_id="")
        reached = reclaim(boxed, task, metadata, spot, timeout=60)

        unprivileged_agent(boxed, instance_id="i-replacement")
        done = boxed.wait_state(task, "succeeded", timeout=90)
        out = boxed.logs(task)
        assert done["attempts"] == 2, out
        assert f"starting at step {reached} attempt 2" in out, out  # from the checkpoint's content
        r = vision(boxed).get(f"/api/v1/tasks/{task}/artifacts/out/final.txt")
        assert r.status_code == 200 and r.content == b"finished at step 40\n"
        kinds = {(a["name"], a["attempt"]) for a in vision(boxed).get(f"/api/v1/tasks/{task}/artifacts").json()}
        assert ("checkpoint.tar.gz", 1) in kinds and ("out/final.txt", 2) in kinds
