"""Cloud fakes for the GCP and Azure driver tests: each started once per session and
emptied before every test that uses it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
