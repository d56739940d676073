"""The factory turns a pool's configuration into the right provider, or says why not."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from autoscaler.config import PoolConfig
from autoscaler.errors import ConfigError, MissingExtra
from autoscaler.provisioning import build_provider, catalog_offerings
from providers.fake import FakeProvider
from providers.local import LocalProvider


def pool(**kw: object) -> PoolConfig:
    base: dict[str, object] = {
        "name": "gpu",
        "provider": "fake",
        "region": "us-east-1",
        "zones": ["us-east-1a", "us-east-1b"],
        "instance_types": [
            {
                "name": "g5.xlarge",
                "gpus": 1,
                "gpu_type": "A10G",
                "cpus": 4,
                "memory_mb": 16384,
                "on_demand_price": 1.006,
                "spot_price": 0.45,
            },
            {"name": "g4dn.xlarge", "gpus": 1, "gpu_type": "T4", "on_demand_price": 0.526},
        ],
    }
    base.update(kw)
    return PoolConfig.model_validate(base)


def test_catalog_crosses_types_capacity_and_zones() -> None:
    offerings = catalog_offerings(pool())
    assert len(offerings) == 2 * 2 * 2
    by_key = {o.key: o for o in offerings}
    assert by_key["spot/g5.xlarge/us-east-1a"].hourly_price == 0.45
    assert by_key["on_demand/g5.xlarge/us-east-1b"].hourly_price == 1.006
    # No spot price in the config: the on-demand price is the conservative bound.
    assert by_key["spot/g4dn.xlarge/us-east-1a"].hourly_price == 0.526
    assert [o.capacity_type for o in offerings[:4]] == ["spot"] * 4, "preference order kept"


def test_builds_fake_and_local(tmp_path: Path) -> None:
    fake = build_provider(pool(), deployment="test", home=tmp_path)
    assert isinstance(fake, FakeProvider) and len(fake.offerings()) == 8
    local = build_provider(
        pool(provider="local", instance_types=[], zones=[], simulated_gpus={"count": 2}),
        deployment="test",
        home=tmp_path,
    )
    assert isinstance(local, LocalProvider)
    assert local.offerings()[0].gpus == 2
    assert local.root == tmp_path / "local-instances"


def test_builds_aws_and_reports_bad_options(tmp_path: Path) -> None:
    from providers.aws import AwsProvider

    aws = build_provider(
        pool(provider="aws", image="ami-1", options={"launch_api": "run_instances"}),
        deployment="test",
        home=tmp_path,
    )
    assert isinstance(aws, AwsProvider)
    assert aws.settings.image == "ami-1" and aws.settings.launch_api == "run_instances"
    with pytest.raises(ValidationError, match=r"unknown option; did you mean 'subnets'\?"):
        pool(provider="aws", options={"subnet": ["s-1"]})
    unchecked = pool(provider="aws").model_copy(update={"options": {"subnet": ["s-1"]}})
    with pytest.raises(ConfigError, match=r"pool 'gpu': invalid AWS pool options.subnet: unknown option"):
        build_provider(unchecked, deployment="test", home=tmp_path)


def test_missing_sdk_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "boto3", None)  # what an install without the extra sees
    with pytest.raises(MissingExtra, match=r"pip install 'gpu-autoscaler\[aws\]'"):
        build_provider(pool(provider="aws"), deployment="test", home=tmp_path)
