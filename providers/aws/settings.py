"""The AWS driver's settings, read from a pool's `options` mapping in autoscaler.yaml.

Each field says its unit, default and why. Unknown keys are refused: a typo such as
`subnet` for `subnets` would otherwise launch into the default VPC unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

LaunchApi = Literal["fleet", "run_instances"]


@dataclass(frozen=True)
class AwsSettings:
    region: str
    # Subnets to launch into, by zone ({"us-east-1a": "subnet-1", ...}) or as a list of
    # ids (zones are then looked up once). Empty: the region's default VPC.
    subnets: Mapping[str, str] | tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    # Instance profile (name or ARN) giving the agent what it needs at boot, e.g.
    # ssm:GetParameter on its join-token parameter; never a long-lived key.
    instance_profile: str | None = None
    # AMI id; a pool's `image` takes precedence. Built by agent_image/packer.
    image: str | None = None
    key_name: str | None = None
    # "fleet" (default): an instant CreateFleet over the pool's subnets when the offering
    # has no zone and there are several to choose from, RunInstances otherwise;
    # "run_instances": always RunInstances into the first subnet (simpler IAM, no
    # launch templates).
    launch_api: LaunchApi = "fleet"
    spot_allocation_strategy: str = "price-capacity-optimized"
    on_demand_allocation_strategy: str = "lowest-price"
    # Root volume size in GiB; None keeps the AMI's.
    root_volume_gb: int | None = None
    # SQS queue fed by EventBridge with spot interruption and rebalance events.
    interruption_queue_url: str | None = None
    # Seconds a spot price lookup is reused; prices move hourly at most.
    price_cache_s: float = 300.0
    # botocore attempts per call (standard retry mode, which backs off on throttling).
    max_attempts: int = 3
    # Another EC2 endpoint (LocalStack, moto); None = AWS's.
    endpoint_url: str | None = None
    extra_tags: Mapping[str, str] = field(default_factory=dict)
    # The region's public AWS certificate (PEM, inline or a file path): when set, an
    # agent registers only with an instance identity document it signs (identity.py).
    identity_certificate: str | None = None
    # With identity_certificate: the account the instances must belong to.
    identity_account_id: str | None = None

    @classmethod
    def from_options(cls, region: str, options: Mapping[str, Any], *, image: str | None = None) -> AwsSettings:
        """Validate `options`; raises ValueError with a message naming the bad key."""
        known = {f.name for f in fields(cls)} - {"region"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown AWS option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        if not region or region == "local":
            raise ValueError("an AWS pool needs `region` (e.g. us-east-1)")
        kw: dict[str, Any] = {"region": region}
        for key, value in options.items():
            kw[key] = _check(key, value)
        if image is not None:
            kw["image"] = image
        return cls(**kw)


def _check(key: str, value: Any) -> Any:
    def fail(expected: str) -> ValueError:
        return ValueError(f"AWS option {key!r} must be {expected}, got {value!r}")

    if key == "subnets":
        if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise fail("a list of subnet ids or a mapping zone -> subnet id")
    if key == "security_group_ids":
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise fail("a list of security group ids")
    if key == "launch_api":
        if value not in ("fleet", "run_instances"):
            raise fail("'fleet' or 'run_instances'")
        return value
    if key in ("root_volume_gb", "max_attempts"):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise fail("a positive integer")
        return value
    if key == "price_cache_s":
        if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise fail("a number of seconds >= 0")
        return float(value)
    if key == "extra_tags":
        if isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        raise fail("a mapping of strings")
    if value is not None and not isinstance(value, str):
        raise fail("a string")
    return value
