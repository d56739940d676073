"""`packer validate` on every agent image template (Debian's packer 1.6 works offline)."""

from __future__ import annotations

import pytest

from tests.deploy.conftest import AGENT_IMAGE, require_tool, run

PACKER_DIR = AGENT_IMAGE / "packer"
# The variables each template requires (no default); dummies are enough to validate.
REQUIRED_VARS = {
    "aws.pkr.hcl": {"region": "us-east-1"},
    "gcp.pkr.hcl": {"project_id": "demo-project", "zone": "us-central1-a"},
    "azure.pkr.hcl": {
        "subscription_id": "00000000-0000-0000-0000-000000000000",
        "resource_group": "images",
        "location": "eastus",
    },
}


@pytest.fixture(scope="module")
def packer() -> str:
    return require_tool("packer", "run scripts/ensure-packer.sh (apt-get install packer)")


def _vars(values: dict[str, str]) -> list[str]:
    return [arg for k, v in values.items() for arg in ("-var", f"{k}={v}")]


def test_every_template_is_covered() -> None:
    assert sorted(p.name for p in PACKER_DIR.glob("*.pkr.hcl")) == sorted(REQUIRED_VARS)


@pytest.mark.parametrize("template", sorted(REQUIRED_VARS))
def test_template_validates(packer: str, template: str) -> None:
    res = run([packer, "validate", *_vars(REQUIRED_VARS[template]), template], cwd=PACKER_DIR)
    assert res.returncode == 0, res.stdout + res.stderr


def test_validate_catches_a_missing_required_variable(packer: str) -> None:
    # Guards the check itself: packer must refuse, or the passes above mean nothing.
    res = run([packer, "validate", "aws.pkr.hcl"], cwd=PACKER_DIR)
    assert res.returncode != 0
    assert "region" in res.stdout + res.stderr


def test_templates_are_formatted(packer: str) -> None:
    res = run([packer, "fmt", "-check", "."], cwd=PACKER_DIR)
    assert res.returncode == 0, f"run `packer fmt agent_image/packer`: {res.stdout}{res.stderr}"


@pytest.mark.parametrize("template", sorted(REQUIRED_VARS))
def test_templates_install_agent_and_enable_the_unit(template: str) -> None:
    text = (PACKER_DIR / template).read_text()
    for needed in (
        "install-nvidia.sh",
        "install-agent.sh",
        "autoscaler-agent.service",
        "autoscaler-agent-exit",
        "agent_wheel",
        "agent_version",
    ):
        assert needed in text, f"{template} does not reference {needed}"
    install = (AGENT_IMAGE / "scripts" / "install-agent.sh").read_text()
    assert "systemctl enable autoscaler-agent.service" in install
    assert '"${wheel}[gpu]"' in install.replace("spec=", "")  # the gpu extra (nvidia-ml-py)
