"""Container tasks end to end: real agents against the live server pull an image from
a real local registry and run it with rootful podman (runc). The task's user, env,
secrets, directory and GPUs reach the container; cancel and drain keep the agent's
SIGTERM -> grace -> SIGKILL semantics inside it; pull failures end the attempt with a
reason instead of a hang."""

from __future__ import annotations

import signal
import socket
from collections.abc import Iterator

import pytest

from tests.agent.conftest import AgentHarness, AgentProcess, wait_for
from tests.agent.oci import IMAGE_MARKER, Oci, fake_cdi_gpus, oci_setup

TRAP_TERM = "trap 'echo got TERM; exit 7' TERM; echo ready; while true; do sleep 0.1; done"
IGNORE_TERM = "trap 'echo ignoring TERM' TERM; echo ready; while true; do sleep 0.1; done"


@pytest.fixture(scope="module")
def oci(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oci]:
    with oci_setup(tmp_path_factory.mktemp("oci")) as o:
        yield o


@pytest.fixture
def podman_env(oci: Oci, monkeypatch: pytest.MonkeyPatch) -> Oci:
    """The agents started by the test inherit podman's configuration."""
    for k, v in oci.env.items():
        monkeypatch.setenv(k, v)
    return oci


def unprivileged_agent(harness: AgentHarness, *, gpus: int = 0, extra: list[str] | None = None) -> AgentProcess:
    return harness.start_agent(gpus=gpus, root_tasks=False, extra=["--run-as", "nobody", *(extra or [])])


def test_an_image_task_runs_in_the_container_as_the_task_user_with_its_env(
    harness: AgentHarness, podman_env: Oci
) -> None:
    script = (
        "cat /image-marker; echo uid=$(id -u); echo cwd=$(pwd); echo home=$HOME; "
        'echo "cuda=[$CUDA_VISIBLE_DEVICES]"; echo epochs=$EPOCHS; echo token=$HF_TOKEN; '
        "env | grep REGCRED || echo no-pull-secret; echo kept > /workspace/out.txt; ls /workspace"
    )
    task_id = harness.enqueue(
        ["sh", "-c", script],
        gpus=0,
        image=podman_env.image,
        env={"EPOCHS": "3"},
        # The pull secret is for the registry only (this one asks for no login, so any will do).
        secret_env={"HF_TOKEN": "hf-secret-value", "REGCRED": "robot:pull-password"},
        image_pull_secret="REGCRED",
    )
    agent = unprivileged_agent(harness)
    done = harness.wait_state(task_id, "succeeded", "failed", timeout=60)
    out = harness.logs(task_id, "stdout")
    assert done["state"] == "succeeded", harness.logs(task_id)
    assert done["image"] == podman_env.image and done["image_pull_secret"] == "REGCRED"
    assert IMAGE_MARKER in out  # a file only the image has
    assert "uid=65534" in out  # nobody: the agent's task user, not root
    assert "cwd=/workspace" in out and "home=/workspace" in out and "out.txt" in out
    assert "cuda=[]" in out and "epochs=3" in out and "token=hf-secret-value" in out
    assert "no-pull-secret" in out
    assert "pulling " + podman_env.image in harness.logs(task_id, "stderr")  # the pull's progress is in the log
    assert "robot:pull-password" not in harness.logs(task_id) and "pull-password" not in agent.log()
    work = harness.tmp / f"work-{harness._n}"
    wait_for("the attempt's leftovers to go", lambda: not list(work.iterdir()))  # scratch dir and login file
    assert podman_env.containers(f"autoscaler-{task_id}") == []  # --rm, and rm by name at the end


def test_a_gpu_task_sees_only_its_pinned_gpus(harness: AgentHarness, podman_env: Oci) -> None:
    show = 'env | grep -E "^(FAKE_GPU_|CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES)" | sort; sleep 3'
    with fake_cdi_gpus(2):
        tasks = [harness.enqueue(["sh", "-c", show], gpus=1, image=podman_env.image) for _ in range(2)]
        unprivileged_agent(harness, gpus=2)
        seen = {}
        for t in tasks:
            done = harness.wait_state(t, "succeeded", "failed", timeout=60)
            assert done["state"] == "succeeded", harness.logs(t)
            (index,) = done["gpu_indices"]
            lines = harness.logs(t, "stdout").split()
            # The engine handed in exactly the leased device; CUDA counts it as 0.
            assert lines == ["CUDA_VISIBLE_DEVICES=0", f"FAKE_GPU_{index}=present", f"NVIDIA_VISIBLE_DEVICES={index}"]
            seen[t] = index
    assert sorted(seen.values()) == [0, 1]  # both ran at once, on different GPUs


def test_cancel_sends_sigterm_into_the_container_then_sigkill_after_the_grace(
    harness: AgentHarness, podman_env: Oci
) -> None:
    polite = harness.enqueue(["sh", "-c", TRAP_TERM], gpus=0, image=podman_env.image)
    stubborn = harness.enqueue(["sh", "-c", IGNORE_TERM], gpus=0, image=podman_env.image)
    unprivileged_agent(harness, extra=["--max-tasks", "2"])
    for t in (polite, stubborn):
        wait_for(f"task {t} to start in its container", lambda t=t: "ready" in harness.logs(t), timeout=60)
        assert harness.admin.post(f"/api/v1/tasks/{t}/cancel").status_code == 200
    p = harness.wait_state(polite, "canceled", timeout=30)
    assert "got TERM" in harness.logs(polite) and p["exit_code"] == 7  # the task's own exit code
    s = harness.wait_state(stubborn, "canceled", timeout=30)
    assert "ignoring TERM" in harness.logs(stubborn)
    assert s["exit_code"] == 137  # SIGKILL after --kill-grace 1, as the engine reports it
    for t in (polite, stubborn):
        wait_for("the container to be removed", lambda t=t: podman_env.containers(f"autoscaler-{t}") == [])


def test_a_drain_interrupts_a_container_task_and_requeues_it(harness: AgentHarness, podman_env: Oci) -> None:
    task_id = harness.enqueue(["sh", "-c", TRAP_TERM], gpus=0, image=podman_env.image)
    agent = unprivileged_agent(harness)
    wait_for("the task to start in its container", lambda: "ready" in harness.logs(task_id), timeout=60)
    agent.signal(signal.SIGTERM)  # drain: --drain-deadline 1, then SIGTERM to the task
    assert agent.wait(30) == 0
    t = harness.wait_state(task_id, "queued", timeout=30)
    assert "got TERM" in harness.logs(task_id)
    assert t["interruptions"] == 1 and t["failures"] == 0
    assert any(e["reason"] == "interrupted:drain" for e in t["events"])
    assert podman_env.containers(f"autoscaler-{task_id}") == []


def test_pull_failures_end_the_attempt_with_a_reason_not_a_hang(harness: AgentHarness, podman_env: Oci) -> None:
    missing = harness.enqueue(["true"], gpus=0, image=f"{podman_env.registry}/autoscaler-test/nosuch:1")
    # A registry that accepts connections and never answers: only the pull timeout ends it.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        hanging = harness.enqueue(["true"], gpus=0, image=f"127.0.0.1:{port}/autoscaler-test/busybox:1")
        bad_login = harness.enqueue(
            ["true"], gpus=0, image=podman_env.image, secret_env={"REG": "no-colon"}, image_pull_secret="REG"
        )
        # Canceled while its pull hangs: the pull is stopped at once, no timeout awaited.
        canceled = harness.enqueue(["true"], gpus=0, image=f"127.0.0.1:{port}/autoscaler-test/other:1")
        unprivileged_agent(harness, extra=["--max-tasks", "4", "--image-pull-timeout", "3"])
        wait_for("the pull to begin", lambda: "pulling" in harness.logs(canceled), timeout=30)
        assert harness.admin.post(f"/api/v1/tasks/{canceled}/cancel").status_code == 200
        c = harness.wait_state(canceled, "canceled", timeout=30)
        m = harness.wait_state(missing, "failed", timeout=60)
        h = harness.wait_state(hanging, "failed", timeout=60)
        b = harness.wait_state(bad_login, "failed", timeout=60)
    # Stopped by the cancel, not by the pull timeout.
    assert c["end_reason"] == "canceled" and "canceled by the server" in c["events"][-1]["detail"]
    assert m["end_reason"] == "start_failed" and m["attempts"] == 1
    detail = m["events"][-1]["detail"]
    assert "image pull failed" in detail and "image not found" in detail and "manifest unknown" in detail
    assert h["end_reason"] == "start_failed" and "no image after 3s" in h["events"][-1]["detail"]
    assert b["end_reason"] == "start_failed" and "user:password" in b["events"][-1]["detail"]
    assert "Traceback" not in "".join(a.log() for a in harness.agents)


def test_the_api_refuses_bad_images_and_dangling_pull_secrets(harness: AgentHarness) -> None:
    cases = [
        ({"image": "-v /:/host"}, "is not an image reference"),
        ({"image": "ok/image:1", "image_pull_secret": "NOPE"}, "not one of the task's secret_env names"),
        ({"image_pull_secret": "REG", "secret_env": {"REG": "u:p"}}, "give --image too"),
    ]
    for extra, words in cases:
        body = {"queue": "gpu", "command": ["true"], "team": "vision", **extra}
        r = harness.admin.post("/api/v1/tasks", json=body)
        assert r.status_code == 422 or r.status_code == 400, r.text
        assert words in r.text
    plain = harness.enqueue(["true"], gpus=0)
    assert harness.task(plain)["image"] is None


def test_a_restarted_agent_removes_the_container_its_killed_predecessor_left(
    harness: AgentHarness, podman_env: Oci
) -> None:
    task_id = harness.enqueue(["sh", "-c", TRAP_TERM], gpus=0, image=podman_env.image)
    work = harness.tmp / "shared-work"
    first = unprivileged_agent(harness, extra=["--work-dir", str(work)])
    wait_for("the task to start in its container", lambda: "ready" in harness.logs(task_id), timeout=60)
    first.signal(signal.SIGKILL)
    first.wait()
    # The engine CLI died with the agent; the container it started did not.
    assert podman_env.containers(f"autoscaler-{task_id}") != []
    second = unprivileged_agent(harness, extra=["--work-dir", str(work)])
    wait_for("the leftover container to go", lambda: podman_env.containers(f"autoscaler-{task_id}") == [], timeout=30)
    wait_for("the agent to say so", lambda: "an earlier agent left running" in second.log())
