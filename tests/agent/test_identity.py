"""A real agent on an "AWS" machine sends its instance identity document at registration;
the server, whose pool pins the (stand-in) AWS certificate, accepts only the instance
the cloud signed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from autoscaler.config import AutoscalerConfig
from tests.agent.conftest import AgentHarness
from tests.fakes.aws_identity import FakeAwsSigner
from tests.fakes.metadata import FakeMetadata
from tests.providers.test_aws_identity import POOL, aws_config


@pytest.fixture(scope="module")
def signer() -> FakeAwsSigner:
    return FakeAwsSigner()


@pytest.fixture
def config(signer: FakeAwsSigner) -> AutoscalerConfig:
    return aws_config(signer)


@pytest.fixture
def imds(signer: FakeAwsSigner) -> Iterator[FakeMetadata]:
    fake = FakeMetadata("aws", instance_id="i-0signed", identity=signer.evidence("i-0signed")).start()
    yield fake
    fake.stop()


def test_an_aws_agent_registers_with_its_signed_identity(harness: AgentHarness, imds: FakeMetadata) -> None:
    flags = ["--provider", "aws", "--metadata-url", imds.url]
    agent = harness.start_agent(instance_id="", pool=POOL, extra=flags)
    worker = harness.worker_of("i-0signed")
    assert worker["provider"] == "aws" and worker["pool"] == POOL
    assert ("GET", "/latest/dynamic/instance-identity/document", 200) in imds.requests
    # The same machine's document cannot vouch for another instance id.
    impostor = harness.start_agent(instance_id="i-0victim", pool=POOL, extra=flags)
    assert impostor.wait() == 1
    assert "not the claimed i-0victim" in impostor.log()
    agent.proc.terminate()
    assert agent.wait() == 0
