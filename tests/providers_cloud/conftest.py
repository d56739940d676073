"""Cloud fakes for the GCP and Azure driver tests: each started once per session and
emptied before every test that uses it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.azure import AzureArmFake
from tests.fakes.gcp import GcpComputeFake


@pytest.fixture(scope="session")
def _gcp_server() -> Iterator[GcpComputeFake]:
    fake = GcpComputeFake()
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def gcp_fake(_gcp_server: GcpComputeFake) -> GcpComputeFake:
    _gcp_server.reset()
    return _gcp_server


SUBSCRIPTION = "00000000-1111-2222-3333-444444444444"
SUBNET_ID = (
    f"/subscriptions/{SUBSCRIPTION}/resourceGroups/net-rg/providers/Microsoft.Network"
    "/virtualNetworks/gpu-vnet/subnets/workers"
)


@pytest.fixture(scope="session")
def _azure_server() -> Iterator[AzureArmFake]:
    fake = AzureArmFake(subnets=(SUBNET_ID,))
    fake.start()
    yield fake
    fake.stop()


@pytest.fixture
def azure_fake(_azure_server: AzureArmFake) -> AzureArmFake:
    _azure_server.reset()
    return _azure_server
