"""Terraform checks, offline: fmt, init/validate/test with a mocked AWS provider, and a
round trip of the generated autoscaler.yaml through the control plane's own loader.

GCP and Azure modules cannot be initialised without their providers (no mirror is
available offline); test_terraform_structure.py covers them instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from autoscaler.config import parse_config
from tests.deploy.conftest import TERRAFORM, run

MOCKED = ["modules/aws", "examples/aws-burst", "examples/hybrid"]


def test_fmt(terraform: str) -> None:
    res = run([terraform, "fmt", "-check", "-recursive", "-diff"], cwd=TERRAFORM)
    assert res.returncode == 0, f"run `terraform fmt -recursive terraform`:\n{res.stdout}{res.stderr}"


def test_config_module_tests_need_no_provider(terraform: str, tf_env: dict[str, str]) -> None:
    d = TERRAFORM / "modules" / "config"
    init = run([terraform, "init", "-backend=false", "-input=false", "-no-color"], cwd=d, env=tf_env)
    assert init.returncode == 0, init.stderr
    res = run([terraform, "test", "-no-color"], cwd=d, env=tf_env)
    assert res.returncode == 0 and "0 failed" in res.stdout, res.stdout + res.stderr


@pytest.mark.parametrize("rel", MOCKED)
def test_init_validate_and_mocked_test(terraform: str, tf_env: dict[str, str], rel: str) -> None:
    d = TERRAFORM / rel
    init = run([terraform, "init", "-backend=false", "-input=false", "-no-color"], cwd=d, env=tf_env)
    assert init.returncode == 0, init.stdout + init.stderr
    val = run([terraform, "validate", "-no-color"], cwd=d, env=tf_env)
    assert val.returncode == 0, val.stdout + val.stderr
    res = run([terraform, "test", "-no-color"], cwd=d, env=tf_env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert " passed, 0 failed" in res.stdout, res.stdout


def test_generated_config_is_accepted_by_the_control_plane(terraform: str, tf_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    shutil.copytree(TERRAFORM / "modules" / "config", tmp_path / "config")
    (root / "main.tf").write_text(
        'module "c" {\n  source = "../config"\n  deployment = "demo"\n'
        '  public_url = "https://gpu.example.com"\n'
        '  teams  = [{ name = "vision" }, { name = "nlp" }]\n'
        '  queues = [{ name = "gpu", pools = ["onprem", "burst"], priority = 5, teams = ["vision"] }]\n'
        '  pools = [\n'
        '    { name = "onprem", provider = "static", region = "dc1", max_instances = 2 },\n'
        '    { name = "burst", provider = "aws", region = "eu-west-1", capacity_types = ["spot", "on_demand"],\n'
        '      idle_timeout_s = 120, instance_types = [{ name = "g5.xlarge", gpus = 1, gpu_type = "A10G",'
        ' cpus = 4, memory_mb = 16384, on_demand_price = 1.006 }] },\n'
        '  ]\n'
        '  pool_options_provider = "aws"\n'
        '  pool_options = { subnet_ids = ["subnet-a"], instance_profile = "demo-agent" }\n'
        '  policy_files = { "data/budgets.yaml" = "teams: {}" }\n'
        '}\noutput "yaml" { value = module.c.yaml }\n'
    )
    assert run([terraform, "init", "-backend=false", "-input=false"], cwd=root, env=tf_env).returncode == 0
    apply = run([terraform, "apply", "-auto-approve", "-input=false", "-no-color"], cwd=root, env=tf_env)
    assert apply.returncode == 0, apply.stdout + apply.stderr
    out = run([terraform, "output", "-json"], cwd=root, env=tf_env)
    cfg = parse_config(json.loads(out.stdout)["yaml"]["value"], root / "autoscaler.yaml")
    assert cfg.deployment == "demo"
    assert cfg.server.tls_terminated_upstream and cfg.server.public_url == "https://gpu.example.com"
    burst = cfg.pool("burst")
    assert burst is not None and burst.options["instance_profile"] == "demo-agent"
    assert burst.instance_types[0].on_demand_price == pytest.approx(1.006)
    assert cfg.pool("onprem") is not None and cfg.pool("onprem").options == {}  # type: ignore[union-attr]
    assert cfg.policy.dir == "/etc/autoscaler/policies"
