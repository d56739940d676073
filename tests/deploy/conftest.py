"""Shared helpers for the deployment checks: the tools they drive and where they are.

A missing tool is a failure with a message naming the install step, never a skip:
`make test` installs packer and checkov through scripts/ensure-*.sh, and terraform's
AWS provider comes from a local filesystem mirror (no registry is reachable offline).

The slow tools (checkov, `terraform test` with the AWS provider) spend much of their
time starting up and waiting, so `background` starts all of them at once, the first
time any test asks, and each test then asserts on its own job's result.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
AGENT_IMAGE = REPO / "agent_image"
CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"

# Where machine images and CI runners keep a Terraform provider mirror. Searched with
# a bounded depth so a test never walks the whole disk.
_MIRROR_ROOTS = ("/opt", "/usr/local/share", "/usr/share", str(Path.home() / ".terraform.d"))
_AWS_PROVIDER = Path("registry.terraform.io") / "hashicorp" / "aws"


def require_tool(name: str, how: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: {how}", pytrace=False)
    return path


def find_provider_mirror() -> Path | None:
    """A directory holding registry.terraform.io/hashicorp/aws/<version>/..., or None."""
    explicit = os.environ.get("AUTOSCALER_TF_PLUGIN_MIRROR")
    candidates = [Path(explicit)] if explicit else []
    for root in _MIRROR_ROOTS:
        base = Path(root)
        if not base.is_dir():
            continue
        # depth <= 3 below the root: /opt/<x>/registry.terraform.io/hashicorp/aws
        for depth in range(0, 3):
            pattern = "/".join(["*"] * depth + [str(_AWS_PROVIDER)]) if depth else str(_AWS_PROVIDER)
            candidates.extend(p.parents[2] for p in base.glob(pattern))
    for c in candidates:
        if (c / _AWS_PROVIDER).is_dir() and any((c / _AWS_PROVIDER).iterdir()):
            return c
    return None


def run(
    cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def terraform() -> str:
    return require_tool("terraform", "install Terraform >= 1.7 (the CI image has 1.11)")


def _no_mirror() -> str:
    return (
        "no filesystem mirror of the hashicorp/aws Terraform provider was found under "
        f"{', '.join(_MIRROR_ROOTS)}; set AUTOSCALER_TF_PLUGIN_MIRROR to a directory containing "
        "registry.terraform.io/hashicorp/aws/<version>/ (terraform providers mirror DIR makes one)"
    )


@pytest.fixture(scope="session")
def tf_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for terraform with the offline provider mirror configured."""
    mirror = find_provider_mirror()
    if mirror is None:
        pytest.fail(_no_mirror(), pytrace=False)
    return _tf_env_for(mirror, tmp_path_factory.mktemp("tf"))


def _tf_env_for(mirror: Path, workdir: Path) -> dict[str, str]:
    rc = workdir / "terraformrc"
    rc.write_text(
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{mirror}"\n    include = ["registry.terraform.io/hashicorp/*"]\n  }}\n'
        '  direct {\n    exclude = ["registry.terraform.io/*/*"]\n  }\n}\n'
    )
    # No TF_PLUGIN_CACHE_DIR: init links the unpacked mirror's provider in place (about
    # a second), while a cache would first copy the 600 MB binary into it.
    env = dict(os.environ, TF_CLI_CONFIG_FILE=str(rc), TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1")
    return env


Steps = list[subprocess.CompletedProcess[str]]


class Background:
    """Slow tool runs started together in threads (each waits on its own subprocesses)."""

    def __init__(self) -> None:
        # One thread per job: they are subprocess waits, not Python work.
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="deploy-check")
        self._jobs: dict[str, Future[Steps]] = {}
        self.missing: dict[str, str] = {}

    def submit(self, name: str, job: Callable[[], Steps]) -> None:
        self._jobs[name] = self._pool.submit(job)

    def result(self, name: str) -> Steps:
        if name in self.missing:
            pytest.fail(self.missing[name], pytrace=False)
        return self._jobs[name].result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def chain(cmds: list[tuple[list[str], Path]], env: dict[str, str] | None = None, timeout: float = 600) -> Steps:
    """Run commands in order, stopping after the first that fails; every result is kept."""
    done: Steps = []
    for cmd, cwd in cmds:
        done.append(run(cmd, cwd=cwd, env=env, timeout=timeout))
        if done[-1].returncode != 0:
            break
    return done


# Root modules with a mocked AWS provider: init, validate and `terraform test` each.
MOCKED = ["modules/aws", "examples/aws-burst", "examples/hybrid"]

# One scan of every module, example and Dockerfile. --quiet leaves passed and skipped
# checks out of the report (their counts stay in each summary); skip reasons are
# checked in the sources instead (test_checkov.py). terraform test files
# (*.tftest.hcl) are not configuration; checkov cannot parse them.
CHECKOV_ARGS = [
    "--skip-download",
    "--compact",
    "--quiet",
    "-o",
    "json",
    "--framework",
    "terraform",
    "dockerfile",
    "--skip-path",
    "/tests/",
    "-d",
    "terraform",
    "-d",
    "agent_image/docker",
]


def _terraform_jobs(terraform: str, render_root: Path) -> dict[str, list[tuple[list[str], Path]]]:
    init = [terraform, "init", "-backend=false", "-input=false", "-no-color"]
    jobs = {
        rel: [
            (init, TERRAFORM / rel),
            ([terraform, "validate", "-no-color"], TERRAFORM / rel),
            ([terraform, "test", "-no-color"], TERRAFORM / rel),
        ]
        for rel in MOCKED
    }
    config = TERRAFORM / "modules" / "config"
    jobs["modules/config"] = [(init, config), ([terraform, "test", "-no-color"], config)]
    jobs["render"] = [
        (init, render_root),
        ([terraform, "apply", "-auto-approve", "-input=false", "-no-color"], render_root),
        ([terraform, "output", "-json"], render_root),
    ]
    return jobs


@pytest.fixture(scope="session")
def background(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    """Starts checkov and every terraform job at once; tests wait on their own."""
    from tests.deploy.render_root import write_render_root

    bg = Background()
    if CHECKOV.exists():
        bg.submit("checkov", partial(chain, [([str(CHECKOV), *CHECKOV_ARGS], REPO)]))
    else:
        bg.missing["checkov"] = "checkov is not installed: run scripts/ensure-checkov.sh"
    terraform, mirror = shutil.which("terraform"), find_provider_mirror()
    render_root = write_render_root(tmp_path_factory.mktemp("render"))
    jobs = _terraform_jobs(terraform or "terraform", render_root)
    if terraform is None or mirror is None:
        why = (
            "terraform is not installed: install Terraform >= 1.7 (the CI image has 1.11)"
            if terraform is None
            else _no_mirror()
        )
        bg.missing.update(dict.fromkeys(jobs, why))
    else:
        env = _tf_env_for(mirror, tmp_path_factory.mktemp("tf-bg"))
        for name, cmds in jobs.items():
            bg.submit(name, partial(chain, cmds, env))
    yield bg
    bg.close()
