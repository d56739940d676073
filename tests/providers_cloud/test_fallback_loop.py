"""Through the reconcile loop: the real reconciler, planner and shipped policy drive the
GCP and Azure drivers (real SDK clients) against the REST fakes. Spot capacity runs out
in one zone, then in the next, and the loop ends on on-demand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.auth.credentials import AnonymousCredentials
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.policy.service import PolicyService
from autoscaler.provisioning import catalog_offerings
from autoscaler.state.db import make_engine, session_factory
from providers.azure import AzureProvider, AzureSettings
from providers.base import Provider
from providers.gcp import GcpProvider, GcpSettings
from tests.fakes.azure import AzureArmFake
from tests.fakes.gcp import GcpComputeFake
from tests.providers_cloud.conftest import SUBNET_ID, SUBSCRIPTION
from tests.providers_cloud.test_azure import StaticBearer
from tests.reconciler.harness import Rig, make_rig, policy_service

GCP_POOL = """
deployment: test
teams: [{{name: vision}}]
queues: [{{name: gpu, pools: [gpu-pool]}}]
pools:
  - name: gpu-pool
    provider: gcp
    region: us-central1
    zones: [us-central1-a, us-central1-b]
    capacity_types: [spot, on_demand]
    image: projects/debian-cloud/global/images/family/debian-12
    max_instances: 2
    options: {{project: proj-1, api_endpoint: "{url}"}}
    instance_types:
      - {{name: n1-standard-8, gpus: 1, gpu_type: nvidia-tesla-t4, cpus: 8, memory_mb: 30000,
          on_demand_price: 0.55, spot_price: 0.15}}
"""

AZURE_POOL = """
deployment: test
teams: [{{name: vision}}]
queues: [{{name: gpu, pools: [gpu-pool]}}]
pools:
  - name: gpu-pool
    provider: azure
    region: eastus
    zones: ["1", "2"]
    capacity_types: [spot, on_demand]
    image: "Canonical:0001-com-ubuntu-server-jammy:22_04-lts-gen2:latest"
    max_instances: 2
    options: {{subscription_id: "{sub}", resource_group: gpu-rg, subnet_id: "{subnet}",
               ssh_public_key: "ssh-ed25519 AAAA test", base_url: "{url}", sdk_retries: 0}}
    instance_types:
      - {{name: Standard_NC4as_T4_v3, gpus: 1, gpu_type: T4, cpus: 4, memory_mb: 28000,
          on_demand_price: 0.53, spot_price: 0.16}}
"""


@pytest.fixture(scope="module")
def policy() -> Iterator[PolicyService]:
    svc = policy_service()
    yield svc
    svc.close()


@pytest.fixture
def sessions(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(sqlite_url)
    yield session_factory(engine)
    engine.dispose()


def run_until_launched(rig: Rig, provider: Provider, clock: ManualClock) -> None:
    reconciler = rig.reconciler({"gpu-pool": provider})
    rig.enqueue(team="vision", gpus=1, queue="gpu")
    for _ in range(8):
        reconciler.run_cycle()
        if any(i.provider_instance_id for i in rig.instances()):
            return
        clock.advance(60)  # past the pool's backoff; the offering blocks last longer (180 s)
    raise AssertionError(f"nothing launched: {[(i.state, i.last_error) for i in rig.instances()]}")


def test_gcp_spot_zone_then_next_zone_then_on_demand(
    gcp_fake: GcpComputeFake, sessions: sessionmaker[Session], clock: ManualClock, policy: PolicyService
) -> None:
    config = parse_config(GCP_POOL.format(url=gcp_fake.url), Path("gcp.yaml"))
    pool = config.pools[0]
    settings = GcpSettings.from_options(pool.options, region=pool.region, zones=pool.zones, image=pool.image)
    provider = GcpProvider(settings, catalog_offerings(pool), credentials=AnonymousCredentials())  # type: ignore[no-untyped-call]
    rig = make_rig(sessions, config, clock, policy)
    gcp_fake.fail_insert("ZONE_RESOURCE_POOL_EXHAUSTED", zone="us-central1-a")
    gcp_fake.fail_insert("ZONE_RESOURCE_POOL_EXHAUSTED", zone="us-central1-b")

    run_until_launched(rig, provider, clock)

    tried = [
        (r.path.split("/zones/")[1].split("/")[0], r.body["scheduling"]["provisioningModel"])
        for r in gcp_fake.requests_matching("POST", "/instances")
    ]
    assert [model for _, model in tried] == ["SPOT", "SPOT", "STANDARD"]
    assert {zone for zone, _ in tried[:2]} == {"us-central1-a", "us-central1-b"}
    [live] = gcp_fake.live()
    assert live["scheduling"]["provisioningModel"] == "STANDARD"
    launched = [i for i in rig.instances() if i.provider_instance_id]
    assert [(i.capacity_type, i.provider) for i in launched] == [("on_demand", "gcp")]
    failed = [i for i in rig.instances() if not i.provider_instance_id]
    assert len(failed) == 2 and all("ZONE_RESOURCE_POOL_EXHAUSTED" in (i.last_error or "") for i in failed)


def test_azure_spot_zone_then_next_zone_then_regular(
    azure_fake: AzureArmFake, sessions: sessionmaker[Session], clock: ManualClock, policy: PolicyService
) -> None:
    config = parse_config(AZURE_POOL.format(url=azure_fake.url, sub=SUBSCRIPTION, subnet=SUBNET_ID), Path("azure.yaml"))
    pool = config.pools[0]
    settings = AzureSettings.from_options(pool.options, region=pool.region, image=pool.image)
    provider = AzureProvider(
        settings,
        catalog_offerings(pool),
        credential=object(),
        client_kwargs={"authentication_policy": StaticBearer(), "polling_interval": 0},
    )
    rig = make_rig(sessions, config, clock, policy)
    azure_fake.fail_create("ZonalAllocationFailed", leave_behind=True)
    azure_fake.fail_create("AllocationFailed", leave_behind=True)

    run_until_launched(rig, provider, clock)

    puts: list[Any] = [r.body for r in azure_fake.requests_matching("PUT", "/virtualMachines/")]
    assert [b["properties"]["priority"] for b in puts] == ["Spot", "Spot", "Regular"]
    assert {b["zones"][0] for b in puts[:2]} == {"1", "2"}
    # The failed spot VMs were deleted; only the regular one is left, with its NIC and disk.
    assert [vm["properties"]["priority"] for vm in azure_fake.vms.values()] == ["Regular"]
    assert len(azure_fake.nics) == 1 and len(azure_fake.disks) == 1
