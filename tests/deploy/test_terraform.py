"""Terraform checks, offline: fmt, init/validate/test with a mocked AWS provider, and a
round trip of the generated autoscaler.yaml through the control plane's own loader and
provider factory.

GCP and Azure modules cannot be initialised without their providers (no mirror is
available offline); test_terraform_structure.py covers them instead. The slow runs
happen together in the `background` fixture (conftest.py); each test here asserts on
its own job.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.provisioning import build_provider
from tests.deploy.conftest import MOCKED, TERRAFORM, Background, run
from tests.deploy.render_root import POOL_OPTIONS
from tests.deploy.test_terraform_structure import _load


def _output(step: subprocess.CompletedProcess[str]) -> str:
    return f"$ {' '.join(map(str, step.args))}\n{step.stdout}{step.stderr}"


def _passed(steps: list[subprocess.CompletedProcess[str]], count: int) -> list[subprocess.CompletedProcess[str]]:
    """Every step ran and succeeded (a chain stops at its first failure)."""
    failed = [s for s in steps if s.returncode != 0]
    assert not failed, _output(failed[0])
    assert len(steps) == count, [s.args for s in steps]
    return steps


def test_fmt(terraform: str) -> None:
    res = run([terraform, "fmt", "-check", "-recursive", "-diff"], cwd=TERRAFORM)
    assert res.returncode == 0, f"run `terraform fmt -recursive terraform`:\n{res.stdout}{res.stderr}"


def test_config_module_tests_need_no_provider(background: Background) -> None:
    *_, test = _passed(background.result("modules/config"), 2)
    assert " passed, 0 failed" in test.stdout, test.stdout


@pytest.mark.parametrize("rel", MOCKED)
def test_init_validate_and_mocked_test(background: Background, rel: str) -> None:
    _init, _validate, test = _passed(background.result(rel), 3)
    assert " passed, 0 failed" in test.stdout, test.stdout


@pytest.fixture(scope="module")
def rendered(background: Background, tmp_path_factory: pytest.TempPathFactory) -> dict[str, AutoscalerConfig]:
    *_, out = _passed(background.result("render"), 3)
    where = tmp_path_factory.mktemp("rendered") / "autoscaler.yaml"
    return {name.removesuffix("_yaml"): parse_config(o["value"], where) for name, o in json.loads(out.stdout).items()}


def test_generated_config_is_accepted_by_the_control_plane(rendered: dict[str, AutoscalerConfig]) -> None:
    cfg = rendered["yaml"]
    assert cfg.deployment == "demo"
    assert cfg.server.tls_terminated_upstream and cfg.server.public_url == "https://gpu.example.com"
    burst = cfg.pool("burst")
    assert burst is not None and burst.options["instance_profile"] == "demo-agent"
    assert burst.instance_types[0].on_demand_price == pytest.approx(1.006)
    assert cfg.pool("onprem") is not None and cfg.pool("onprem").options == {}  # type: ignore[union-attr]
    assert cfg.policy.dir == "/etc/autoscaler/policies"


def test_sample_options_are_the_keys_each_cloud_module_emits() -> None:
    # The build test below uses POOL_OPTIONS; this ties those keys to the modules' own
    # pool_options blocks, so a key added or renamed in Terraform reaches the build.
    for cloud in ("aws", "gcp", "azure"):
        config = _load(cloud)["module"][0]["config"]
        assert config["pool_options_provider"] == cloud
        assert set(config["pool_options"]) == set(POOL_OPTIONS[cloud]), cloud


def _seams(provider: str) -> dict[str, Any]:
    """Credentials stand-ins: building a driver must not look for real ones."""
    if provider == "gcp":
        from google.auth.credentials import AnonymousCredentials

        return {"credentials": AnonymousCredentials()}  # type: ignore[no-untyped-call]
    if provider == "azure":
        from azure.core.credentials import AccessToken

        class NoCredential:
            def get_token(self, *scopes: str, **kw: Any) -> AccessToken:
                raise AssertionError("building a provider must not fetch a token")

        return {"credential": NoCredential()}
    return {}


def test_every_rendered_pool_builds_with_the_real_provider(
    rendered: dict[str, AutoscalerConfig], tmp_path: Path
) -> None:
    built: dict[str, Any] = {}
    for cfg in rendered.values():
        for pool in cfg.pools:
            built[pool.name] = build_provider(pool, deployment=cfg.deployment, home=tmp_path, **_seams(pool.provider))
    assert set(built) == {"onprem", "burst", "aws-burst", "gcp-l4", "azure-t4"}
    aws = built["aws-burst"].settings
    assert aws.subnets == ("subnet-a", "subnet-b") and aws.security_group_ids == ("sg-0agent",)
    assert aws.instance_profile == "demo-agent"
    gcp = built["gcp-l4"].settings
    assert (gcp.project, gcp.name_prefix, gcp.external_ip) == ("demo-project", "demo", False)
    assert gcp.service_account == POOL_OPTIONS["gcp"]["service_account"]
    azure = built["azure-t4"].settings
    assert azure.subnet_id.endswith("/subnets/agents") and azure.resource_group == "demo-agents"
