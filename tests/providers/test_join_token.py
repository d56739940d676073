"""The join token in user-data registers once and expires: checked against the real server.

The token is read back from the user-data the AWS driver really sent to EC2 (moto),
then presented to the live API as an agent on a booted VM would.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import timedelta

import boto3
import httpx
import pytest
from botocore.config import Config
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig
from providers.aws import AwsProvider, AwsSettings
from providers.base import LaunchRequest, Offering
from providers.bootstrap import BootstrapSpec, parse_user_data, render_user_data
from tests.conftest import LiveServer, issue_token, make_context
from tests.fakes.aws import REGION, TEST_CREDENTIALS, MotoEC2, unique_owner

POOL = "gpu-pool"
OFFERING = Offering("g5.xlarge", "spot", None, 1, "A10G", 4, 16384, 0.45, region=REGION)


@pytest.fixture
def server(config: AutoscalerConfig, sessions: sessionmaker[Session], clock: ManualClock) -> Iterator[LiveServer]:
    live = LiveServer(make_context(config, sessions, clock)).start()
    yield live
    live.stop()


def launch_with_token(moto: MotoEC2, server_url: str, token: str) -> str:
    """Launch one instance on moto with this join token; return the token read back from EC2."""
    settings = AwsSettings.from_options(
        REGION, {"endpoint_url": moto.url, "launch_api": "run_instances"}, image="ami-03cf127a"
    )
    session = boto3.session.Session(region_name=REGION, **TEST_CREDENTIALS)
    aws = AwsProvider(settings, [OFFERING], session=session, boto_config=Config(retries={"total_max_attempts": 1}))
    spec = BootstrapSpec(server_url=server_url, pool=POOL, provider="aws", join_token=token)
    (inst,) = aws.launch(
        LaunchRequest(
            request_id=unique_owner("join"),
            pool=POOL,
            owner=unique_owner(),
            offering=OFFERING,
            user_data=render_user_data(spec),
        )
    )
    attr = moto.client().describe_instance_attribute(InstanceId=inst.instance_id, Attribute="userData")
    boot = parse_user_data(base64.b64decode(attr["UserData"]["Value"]).decode())
    assert boot["server_url"] == server_url
    return str(boot["join_token"])


def register(url: str, token: str, instance_id: str) -> httpx.Response:
    body = {
        "hostname": instance_id,
        "instance_id": instance_id,
        "provider": "aws",
        "pool": POOL,
        "cpus": 4,
        "memory_mb": 16384,
    }
    return httpx.post(
        f"{url}/api/v1/workers/register", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=10
    )


def test_join_token_registers_once_and_expires(server: LiveServer, moto_ec2: MotoEC2, clock: ManualClock) -> None:
    token = issue_token(server.ctx, "join", pool=POOL, ttl=timedelta(minutes=30))
    from_user_data = launch_with_token(moto_ec2, server.url, token)
    assert from_user_data == token

    first = register(server.url, from_user_data, "i-first")
    assert first.status_code == 201, first.text
    assert first.json()["worker_token"].startswith("asw_")
    # Spent: neither the same instance (a task that read user-data) nor another may use it again.
    again = register(server.url, from_user_data, "i-first")
    assert again.status_code == 403 and "already used" in again.text
    second = register(server.url, from_user_data, "i-second")
    assert second.status_code == 403 and "already used" in second.text

    unused = issue_token(server.ctx, "join", pool=POOL, ttl=timedelta(minutes=30))
    clock.advance(31 * 60)
    expired = register(server.url, unused, "i-third")
    assert expired.status_code == 401
    assert "expired" in expired.text
