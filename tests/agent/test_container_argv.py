"""The container engine's command lines, table by table: GPU devices per engine and
CDI, the environment inside, user, limits, the task dir; pull failure reasons and
registry logins. GPUs inside a container need a GPU machine: these tests pin down the
exact arguments the agent hands the engine."""

from __future__ import annotations

import base64
import json
import stat
import subprocess
from pathlib import Path

import pytest

from autoscaler.agent.container import (
    SETUP_FAILED_FILE,
    SETUP_WRAPPER,
    TASK_DIR,
    ContainerError,
    Engine,
    Identity,
    RunSpec,
    auth_json,
    container_gpu_env,
    container_name,
    detect_engine,
    engine_env_clash,
    gpu_args,
    nvidia_cdi_present,
    pull_argv,
    pull_env,
    pull_failure,
    registry_host,
    run_argv,
    with_setup,
    write_authfile,
)

PODMAN = Engine("podman", "/usr/bin/podman", cdi=False)
PODMAN_CDI = Engine("podman", "/usr/bin/podman", cdi=True)
DOCKER = Engine("docker", "/usr/bin/docker", cdi=False)
DOCKER_CDI = Engine("docker", "/usr/bin/docker", cdi=True)


@pytest.mark.parametrize(
    ("engine", "indices", "expected"),
    [
        (PODMAN_CDI, [2], ["--device", "nvidia.com/gpu=2"]),
        (PODMAN_CDI, [1, 3], ["--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3"]),
        (DOCKER_CDI, [0, 5], ["--device", "nvidia.com/gpu=0", "--device", "nvidia.com/gpu=5"]),
        (DOCKER, [4], ["--gpus", '"device=4"']),
        (DOCKER, [0, 2], ["--gpus", '"device=0,2"']),
        (PODMAN, [], []),
        (DOCKER, [], []),
        (PODMAN_CDI, [], []),
    ],
)
def test_gpu_devices_are_exactly_the_tasks(engine: Engine, indices: list[int], expected: list[str]) -> None:
    assert gpu_args(engine, indices) == expected


def test_podman_without_a_cdi_spec_refuses_gpus_and_says_how_to_fix_it() -> None:
    with pytest.raises(ContainerError, match="nvidia-ctk cdi generate"):
        gpu_args(PODMAN, [0])


@pytest.mark.parametrize(
    ("indices", "cuda", "nvidia"),
    [([3], "0", "3"), ([1, 2], "0,1", "1,2"), ([], "", "void")],
)
def test_inside_the_container_cuda_counts_from_zero(indices: list[int], cuda: str, nvidia: str) -> None:
    env = container_gpu_env(indices)
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": cuda, "NVIDIA_VISIBLE_DEVICES": nvidia}


def _spec(**kw: object) -> RunSpec:
    base: dict[str, object] = {
        "task_id": "t1",
        "attempt": 2,
        "image": "registry.example:5000/team/train:1.2",
        "command": ["python", "train.py", "--epochs", "3"],
        "host_dir": Path("/var/lib/agent/work/t1-2"),
    }
    return RunSpec(**{**base, **kw})  # type: ignore[arg-type]


def _flag_values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_run_argv_carries_everything_and_ends_with_image_and_command() -> None:
    spec = _spec(
        env={"EPOCHS": "3"},
        secret_names=["WANDB_API_KEY"],
        gpu_indices=[1, 3],
        cpus=2.5,
        memory_mb=4096,
        user=Identity(61001, 1500, (1500, 44)),
    )
    argv = run_argv(PODMAN_CDI, spec)
    assert argv[:2] == ["/usr/bin/podman", "run"]
    for flag in ("--rm", "--init", "--sig-proxy=false"):
        assert flag in argv
    assert _flag_values(argv, "--pull") == ["never"]
    assert _flag_values(argv, "--name") == ["autoscaler-t1-2"]
    assert _flag_values(argv, "--volume") == ["/var/lib/agent/work/t1-2:/workspace"]
    assert _flag_values(argv, "--workdir") == ["/workspace"]
    assert _flag_values(argv, "--user") == ["61001:1500"]
    assert _flag_values(argv, "--group-add") == ["44"]  # the primary group is not repeated
    assert _flag_values(argv, "--cpus") == ["2.5"]
    assert _flag_values(argv, "--memory") == ["4096m"]
    assert _flag_values(argv, "--device") == ["nvidia.com/gpu=1", "nvidia.com/gpu=3"]
    env = _flag_values(argv, "--env")
    assert "EPOCHS=3" in env and "CUDA_VISIBLE_DEVICES=0,1" in env and "NVIDIA_VISIBLE_DEVICES=1,3" in env
    assert "HOME=/workspace" in env and "TMPDIR=/workspace" in env
    assert "AUTOSCALER_TASK_ID=t1" in env and "AUTOSCALER_TASK_ATTEMPT=2" in env
    # A secret is named only: its value reaches the engine through its environment.
    assert "WANDB_API_KEY" in env and not any(e.startswith("WANDB_API_KEY=") for e in env)
    assert argv[-5:] == ["registry.example:5000/team/train:1.2", "python", "train.py", "--epochs", "3"]


def test_no_limits_no_user_no_gpus_means_no_such_flags() -> None:
    argv = run_argv(PODMAN, _spec())
    for flag in ("--user", "--group-add", "--cpus", "--memory", "--device", "--gpus"):
        assert flag not in argv
    assert "NVIDIA_VISIBLE_DEVICES=void" in _flag_values(argv, "--env")


def test_simulated_gpus_get_the_environment_but_no_devices() -> None:
    argv = run_argv(PODMAN, _spec(gpu_indices=[0], gpu_devices=False))
    assert "--device" not in argv and "--gpus" not in argv
    assert "CUDA_VISIBLE_DEVICES=0" in _flag_values(argv, "--env")


def test_docker_gets_gpus_flag_when_no_cdi() -> None:
    argv = run_argv(DOCKER, _spec(gpu_indices=[2]))
    assert _flag_values(argv, "--gpus") == ['"device=2"'] and "--device" not in argv


def test_container_names_are_per_attempt_and_safe() -> None:
    assert container_name("abc", 1) != container_name("abc", 2)
    assert container_name("a/b c", 1) == "autoscaler-a_b_c-1"


@pytest.mark.parametrize(
    ("names", "clash"),
    [
        (["WANDB_API_KEY", "HF_TOKEN"], []),
        (["PATH", "HF_TOKEN"], ["PATH"]),
        (["CONTAINERS_CONF", "DOCKER_HOST", "XDG_RUNTIME_DIR"], ["CONTAINERS_CONF", "DOCKER_HOST", "XDG_RUNTIME_DIR"]),
    ],
)
def test_secrets_the_engine_would_read_are_found(names: list[str], clash: list[str]) -> None:
    assert engine_env_clash(names) == clash


@pytest.mark.parametrize(
    ("output", "words"),
    [
        (
            "Error: initializing source docker://r:5000/x:1: reading manifest 1 in r:5000/x: manifest unknown",
            "image not found",
        ),
        ("Error: docker.io/library/nosuch: repository does not exist or may require 'docker login'", "not found"),
        ("Error: initializing source: unauthorized: authentication required", "refused the login"),
        ("Error response from daemon: pull access denied for x, repository does not exist", "refused the login"),
        (
            'Error: pinging container registry r:5: Get "http://r:5/v2/": dial tcp: connect: connection refused',
            "unreachable",
        ),
        ("Error: something else entirely", "image pull failed: img: something else entirely"),
    ],
)
def test_pull_failures_say_what_went_wrong(output: str, words: str) -> None:
    reason = pull_failure("img", "Trying to pull img...\n" + output + "\n", 125)
    assert reason.startswith("image pull failed: img: ") and words in reason


def test_a_silent_pull_failure_still_has_a_reason() -> None:
    assert pull_failure("img", "", 3) == "image pull failed: img: exit code 3"


@pytest.mark.parametrize(
    ("image", "host"),
    [
        ("registry.example:5000/team/x:1", "registry.example:5000"),
        ("127.0.0.1:5055/x", "127.0.0.1:5055"),
        ("localhost/x", "localhost"),
        ("ubuntu:22.04", "docker.io"),
        ("team/train:1", "docker.io"),
    ],
)
def test_registry_host(image: str, host: str) -> None:
    assert registry_host(image) == host


def test_user_password_login_becomes_an_auth_file_for_the_images_registry() -> None:
    data = json.loads(auth_json("ghcr.io/team/x:1", "bot:s3:cr3t"))
    token = data["auths"]["ghcr.io"]["auth"]
    assert base64.b64decode(token).decode() == "bot:s3:cr3t"


def test_auth_json_passes_through_and_bad_logins_are_refused() -> None:
    given = {"auths": {"r.example": {"auth": "eDp5"}}}
    assert json.loads(auth_json("r.example/x", json.dumps(given))) == given
    for bad in ("no-colon", ":only-password", "{not json", '{"x": 1}'):
        with pytest.raises(ContainerError, match="image_pull_secret"):
            auth_json("r.example/x", bad)


def test_the_auth_file_is_private(tmp_path: Path) -> None:
    path = write_authfile(tmp_path / ".pull-x", '{"auths": {}}')
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert pull_argv(PODMAN, "img", path) == ["/usr/bin/podman", "pull", "--authfile", str(path), "img"]
    # docker has no --authfile: it reads $DOCKER_CONFIG/config.json.
    assert pull_argv(DOCKER, "img", path) == ["/usr/bin/docker", "pull", "img"]
    assert pull_env(DOCKER, {"PATH": "/bin"}, path)["DOCKER_CONFIG"] == str(path.parent)
    assert "DOCKER_CONFIG" not in pull_env(PODMAN, {"PATH": "/bin"}, path)


def test_cdi_detection_reads_the_spec_kind(tmp_path: Path) -> None:
    (tmp_path / "other.yaml").write_text('cdiVersion: "0.5.0"\nkind: vendor.example/fpga\n')
    assert not nvidia_cdi_present([tmp_path, tmp_path / "missing"])
    (tmp_path / "nvidia.json").write_text('{"cdiVersion": "0.5.0", "kind": "nvidia.com/gpu", "devices": []}')
    assert nvidia_cdi_present([tmp_path])


def test_engine_detection_prefers_podman_then_docker(tmp_path: Path) -> None:
    found = {"docker": "/usr/bin/docker"}
    engine = detect_engine(found.get, [tmp_path])
    assert engine == Engine("docker", "/usr/bin/docker", cdi=False)
    found["podman"] = "/usr/bin/podman"
    assert detect_engine(found.get, [tmp_path]) == Engine("podman", "/usr/bin/podman", cdi=False)
    assert detect_engine({}.get, [tmp_path]) is None


def test_a_setup_wraps_the_command_in_the_images_shell() -> None:
    spec = RunSpec("t1", 1, "img:1", with_setup("pip install -r r.txt", ["python", "a b"]), Path("/w"))
    tail = ["img:1", "/bin/sh", "-c", SETUP_WRAPPER, "autoscaler-setup", "pip install -r r.txt", "python", "a b"]
    assert run_argv(PODMAN, spec)[-len(tail) :] == tail


def _wrapper_on_this_machine(task_dir: Path, setup: str, command: list[str]) -> subprocess.CompletedProcess[str]:
    """The wrapper run by this machine's /bin/sh, with the task dir at `task_dir`."""
    script = SETUP_WRAPPER.replace(TASK_DIR, str(task_dir))
    return subprocess.run(
        ["/bin/sh", "-c", script, "autoscaler-setup", setup, *command],
        cwd=task_dir,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )


def test_the_setup_wrapper_runs_setup_then_execs_the_command_unchanged(tmp_path: Path) -> None:
    r = _wrapper_on_this_machine(tmp_path, "echo 'in setup' > s.txt; X=1", ["printf", "%s|", "a b", "$HOME", "'q'"])
    assert r.returncode == 0, r.stderr
    assert r.stdout == "a b|$HOME|'q'|"  # no argument re-split or expanded on the way
    assert (tmp_path / "s.txt").read_text() == "in setup\n"
    assert "[autoscaler agent: setup: echo 'in setup' > s.txt; X=1]" in r.stderr
    assert not (tmp_path / SETUP_FAILED_FILE).exists()


def test_a_failing_setup_leaves_its_code_and_the_command_never_runs(tmp_path: Path) -> None:
    r = _wrapper_on_this_machine(tmp_path, "exit 4", ["touch", "ran"])
    assert r.returncode == 4 and (tmp_path / SETUP_FAILED_FILE).read_text().strip() == "4"
    assert not (tmp_path / "ran").exists()
    (tmp_path / "next").mkdir()
    failing_command = _wrapper_on_this_machine(tmp_path / "next", "true", ["sh", "-c", "exit 9"])
    assert failing_command.returncode == 9  # the command's own code, not a setup failure
    assert not (tmp_path / "next" / SETUP_FAILED_FILE).exists()
