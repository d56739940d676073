"""Shared helpers for the deployment checks: the tools they drive and where they are.

A missing tool is a failure with a message naming the install step, never a skip:
`make test` installs packer and checkov through scripts/ensure-*.sh, and terraform's
AWS provider comes from a local filesystem mirror (no registry is reachable offline).
"""

from __future__ import annotations

import os
import shutil
import subprocess
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


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="session")
def terraform() -> str:
    return require_tool("terraform", "install Terraform >= 1.7 (the CI image has 1.11)")


@pytest.fixture(scope="session")
def tf_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for terraform with the offline provider mirror configured."""
    mirror = find_provider_mirror()
    if mirror is None:
        pytest.fail(
            "no filesystem mirror of the hashicorp/aws Terraform provider was found under "
            f"{', '.join(_MIRROR_ROOTS)}; set AUTOSCALER_TF_PLUGIN_MIRROR to a directory containing "
            "registry.terraform.io/hashicorp/aws/<version>/ (terraform providers mirror DIR makes one)",
            pytrace=False,
        )
    rc = tmp_path_factory.mktemp("tf") / "terraformrc"
    rc.write_text(
        "provider_installation {\n"
        f'  filesystem_mirror {{\n    path    = "{mirror}"\n    include = ["registry.terraform.io/hashicorp/*"]\n  }}\n'
        '  direct {\n    exclude = ["registry.terraform.io/*/*"]\n  }\n}\n'
    )
    env = dict(os.environ, TF_CLI_CONFIG_FILE=str(rc), TF_IN_AUTOMATION="1", CHECKPOINT_DISABLE="1")
    return env
