"""Static (on-prem) pools, and the factory building every provider this issue adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.config import parse_config
from autoscaler.errors import ConfigError
from autoscaler.provisioning import build_provider
from providers.azure import AzureProvider
from providers.base import InstanceStatus, InvalidRequest, LaunchRequest
from providers.gcp import GcpProvider
from providers.slurm import SlurmProvider
from providers.static import StaticProvider, StaticSettings

CONFIG = """
deployment: hybrid
pools:
  - name: onprem
    provider: static
    instance_types: [{name: dgx, gpus: 8, gpu_type: A100}]
    options: {machines: [{name: dgx-01, gpus: 8, gpu_type: A100}, dgx-02]}
  - name: slurm-gpu
    provider: slurm
    boot_timeout_s: 300
    instance_types: [{name: slurm.1gpu, gpus: 1}]
    options: {partition: gpu, agent_command: [python3, -m, autoscaler, agent]}
  - name: gcp-gpu
    provider: gcp
    region: us-central1
    zones: [us-central1-a]
    image: projects/debian-cloud/global/images/family/debian-12
    instance_types: [{name: n1-standard-8, gpus: 1, gpu_type: nvidia-tesla-t4, on_demand_price: 0.55}]
    options: {project: proj-1, api_endpoint: "http://127.0.0.1:9"}
  - name: azure-gpu
    provider: azure
    region: eastus
    image: "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"
    instance_types: [{name: Standard_NC4as_T4_v3, gpus: 1, on_demand_price: 0.53}]
    options: {subscription_id: s, resource_group: rg, ssh_public_key: k,
              subnet_id: /subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/w}
"""


def test_factory_builds_each_provider(tmp_path: Path) -> None:
    config = parse_config(CONFIG, Path("hybrid.yaml"))
    built = {p.name: build_provider(p, deployment=config.deployment, home=tmp_path) for p in config.pools[:2]}
    assert isinstance(built["onprem"], StaticProvider) and built["onprem"].capabilities.static
    slurm = built["slurm-gpu"]
    assert isinstance(slurm, SlurmProvider)
    assert slurm.settings.partition == "gpu" and slurm.settings.boot_timeout_s == 300
    assert slurm.settings.state_dir == tmp_path / "slurm" / "slurm-gpu"
    from google.auth.credentials import AnonymousCredentials

    gcp = build_provider(config.pools[2], deployment="hybrid", home=tmp_path, credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    assert isinstance(gcp, GcpProvider) and gcp.settings.project == "proj-1"
    azure = build_provider(config.pools[3], deployment="hybrid", home=tmp_path, credential=object())
    assert isinstance(azure, AzureProvider) and azure.settings.resource_group == "rg"


@pytest.mark.parametrize(
    ("bad", "where", "problem"),
    [
        ("projet: proj-1", "pools.2.options.projet", "unknown option; did you mean 'project'?"),
        ("partition: gpu,", "pools.1.options.partition", "Input should be a valid string"),
        ("dgx-02]}", "pools.0.options.machines.1.gpus", "Input should be greater than or equal to 0"),
        ("ssh_public_key: k,", "pools.3.options.ssh_public_key", "Field required"),
    ],
)
def test_a_bad_pool_option_is_a_config_error_at_its_key_path(bad: str, where: str, problem: str) -> None:
    replacement = {
        "projet: proj-1": ("project: proj-1", "projet: proj-1"),
        "partition: gpu,": ("partition: gpu,", "partition: [gpu],"),
        "dgx-02]}": ("dgx-02]}", "{name: dgx-02, gpus: -1}]}"),
        "ssh_public_key: k,": ("ssh_public_key: k,", ""),
    }[bad]
    with pytest.raises(ConfigError) as info:
        parse_config(CONFIG.replace(*replacement), Path("hybrid.yaml"))
    lines = [line.strip() for line in str(info.value).splitlines()]
    assert any(line.startswith(f"at {where}: {problem}") for line in lines), lines


def test_factory_turns_bad_options_into_one_line_config_errors(tmp_path: Path) -> None:
    config = parse_config(CONFIG, Path("hybrid.yaml"))
    # Options that skipped the config's check (a pool built in code) still meet the driver's.
    unchecked = config.pools[2].model_copy(update={"options": {"projet": "proj-1"}})
    with pytest.raises(
        ConfigError, match=r"^pool 'gcp-gpu': invalid GCP pool .*options.projet: unknown option"
    ) as info:
        build_provider(unchecked, deployment="hybrid", home=tmp_path)
    assert "\n" not in str(info.value)


def test_static_pool_lists_declared_machines_and_never_launches_or_terminates(tmp_path: Path) -> None:
    config = parse_config(CONFIG, Path("hybrid.yaml"))
    provider = build_provider(config.pools[0], deployment="hybrid", home=tmp_path)
    listed = provider.list("hybrid")
    assert [(i.instance_id, i.status, i.pool) for i in listed] == [
        ("dgx-01", InstanceStatus.RUNNING, "onprem"),
        ("dgx-02", InstanceStatus.RUNNING, "onprem"),
    ]
    assert provider.list("another-deployment") == []
    with pytest.raises(InvalidRequest, match="never launched"):
        provider.launch(LaunchRequest("r", "onprem", "hybrid", provider.offerings()[0]))
    provider.terminate(["dgx-01"])  # a no-op: on-prem machines are drained, never powered off
    assert [i.instance_id for i in provider.list("hybrid")] == ["dgx-01", "dgx-02"]


def test_static_machines_are_validated() -> None:
    with pytest.raises(InvalidRequest, match=r"options.machines.0.gpus: Input should be greater than or equal to 0"):
        StaticSettings.from_options({"machines": [{"name": "a", "gpus": -1}]})
    with pytest.raises(InvalidRequest, match="machine names must be unique"):
        StaticSettings.from_options({"machines": ["a", "a"]})
    with pytest.raises(InvalidRequest, match=r"options.machines.0.gpu: unknown option; did you mean 'gpus'\?"):
        StaticSettings.from_options({"machines": [{"name": "a", "gpu": 1}]})
    settings = StaticSettings.from_options({"machines": ["a", {"name": "b", "gpus": 4}]})
    provider = StaticProvider(settings, [], pool="p", owner="o")
    assert [(m.name, m.gpus) for m in provider.machines] == [("a", 0), ("b", 4)]


def test_a_static_pool_refuses_gang_launches_with_the_reason(tmp_path: Path) -> None:
    config = parse_config(CONFIG, Path("hybrid.yaml"))
    provider = build_provider(config.pools[0], deployment="hybrid", home=tmp_path)
    assert provider.capabilities.max_gang_nodes == 2, "the declared machines bound a gang"
    offering = provider.offerings()[0]
    with pytest.raises(InvalidRequest, match=r"launches no machines: a gang of 2 runs on 2 of its registered"):
        provider.launch(LaunchRequest("g", "onprem", "hybrid", offering, nodes=2, gang="g1"))
    with pytest.raises(InvalidRequest, match=r"its 2 declared machine\(s\) cannot hold a gang of 3"):
        provider.launch(LaunchRequest("g", "onprem", "hybrid", offering, nodes=3, gang="g1"))
    undeclared = StaticProvider(StaticSettings.from_options({}), [], pool="p", owner="o")
    assert undeclared.capabilities.max_gang_nodes is None, "machines that join by token: no stated limit"
