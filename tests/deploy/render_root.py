"""A Terraform root that renders autoscaler.yaml through modules/config, once per cloud.

Each cloud module (aws, gcp, azure) hands modules/config the pool `options` its
provider reads. Those modules cannot be applied offline, so the root feeds the config
module the same option KEYS, with plausible values from POOL_OPTIONS; test_terraform.py
checks the keys against each module's own `pool_options` block, then builds every
rendered pool with the control plane's real provider factory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.deploy.conftest import TERRAFORM

# Per provider: a sample of what its cloud module passes as pool_options.
POOL_OPTIONS: dict[str, dict[str, Any]] = {
    "aws": {"subnets": ["subnet-a", "subnet-b"], "security_group_ids": ["sg-0agent"], "instance_profile": "demo-agent"},
    "gcp": {
        "project": "demo-project",
        "network": "projects/demo-project/global/networks/gpu",
        "subnetwork": "projects/demo-project/regions/us-central1/subnetworks/gpu",
        "service_account": "demo-agent@demo-project.iam.gserviceaccount.com",
        "name_prefix": "demo",
        "external_ip": False,
    },
    "azure": {
        "subscription_id": "00000000-0000-0000-0000-000000000000",
        "resource_group": "demo-agents",
        "subnet_id": "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/net"
        "/providers/Microsoft.Network/virtualNetworks/vnet/subnets/agents",
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDemoDemoDemoDemoDemoDemoDemoDemoDemoDemo demo",
    },
}

_GPU = '{ name = "%s", gpus = 1, gpu_type = "%s", cpus = 4, memory_mb = 16384, on_demand_price = %s }'
# One pool per cloud, in the region/zone shape its provider requires.
_CLOUD_POOLS = {
    "aws": '{ name = "aws-burst", provider = "aws", region = "eu-west-1", zones = ["eu-west-1a"],'
    f" instance_types = [{_GPU % ('g5.xlarge', 'A10G', '1.006')}] }}",
    "gcp": '{ name = "gcp-l4", provider = "gcp", region = "us-central1", zones = ["us-central1-a"],'
    f" instance_types = [{_GPU % ('g2-standard-4', 'L4', '0.71')}] }}",
    "azure": '{ name = "azure-t4", provider = "azure", region = "eastus",'
    f" instance_types = [{_GPU % ('Standard_NC4as_T4_v3', 'T4', '0.526')}] }}",
}

# The first module keeps the original round-trip case (a static and an aws pool, teams,
# queues, policy files); the others render one pool of each cloud.
_DEMO = """module "c" {
  source = "../config"
  deployment = "demo"
  public_url = "https://gpu.example.com"
  teams  = [{ name = "vision" }, { name = "nlp" }]
  queues = [{ name = "gpu", pools = ["onprem", "burst"], priority = 5, teams = ["vision"] }]
  pools = [
    { name = "onprem", provider = "static", region = "dc1", max_instances = 2 },
    { name = "burst", provider = "aws", region = "eu-west-1", capacity_types = ["spot", "on_demand"],
      idle_timeout_s = 120, instance_types = [{ name = "g5.xlarge", gpus = 1, gpu_type = "A10G",
      cpus = 4, memory_mb = 16384, on_demand_price = 1.006 }] },
  ]
  pool_options_provider = "aws"
  pool_options = { subnets = ["subnet-a"], instance_profile = "demo-agent" }
  policy_files = { "data/budgets.yaml" = "teams: {}" }
}
output "yaml" { value = module.c.yaml }
"""


def write_render_root(workdir: Path) -> Path:
    """A root module under workdir (beside a copy of modules/config); returns its path."""
    shutil.copytree(
        TERRAFORM / "modules" / "config", workdir / "config", ignore=shutil.ignore_patterns(".terraform*", "tests")
    )
    root = workdir / "root"
    root.mkdir()
    parts = [_DEMO]
    for cloud, pool in _CLOUD_POOLS.items():
        # JSON is valid HCL object/list syntax, so the sample goes in as it is.
        parts.append(
            f'module "{cloud}" {{\n  source = "../config"\n  deployment = "demo"\n'
            f'  public_url = "https://gpu.example.com"\n  pools = [{pool}]\n'
            f'  pool_options_provider = "{cloud}"\n  pool_options = {json.dumps(POOL_OPTIONS[cloud])}\n}}\n'
            f'output "{cloud}_yaml" {{ value = module.{cloud}.yaml }}\n'
        )
    (root / "main.tf").write_text("\n".join(parts))
    return root
