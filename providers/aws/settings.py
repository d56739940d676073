"""The AWS driver's settings: `AwsOptions` is a pool's `options:` block in autoscaler.yaml,
`AwsSettings` adds what comes from the pool itself (region, image).

Each field says its unit, default and why. Unknown keys are refused: a typo such as
`subnet` for `subnets` would otherwise launch into the default VPC unnoticed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from providers.base import DriverOptions, InvalidRequest, Scope, parse_options

LaunchApi = Literal["fleet", "run_instances"]


class PlacementGroupOption(DriverOptions):
    """`placement_group: {strategy: cluster}`: the driver creates one cluster placement
    group per gang (named from the gang id), launches the gang into it and deletes it
    once the gang's instances are gone."""

    strategy: Literal["cluster"] = "cluster"


class AwsOptions(DriverOptions):
    # Subnets to launch into, by zone ({"us-east-1a": "subnet-1", ...}) or as a list of
    # ids (zones are then looked up once). Empty: the region's default VPC.
    subnets: dict[str, str] | tuple[str, ...] = ()
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
    root_volume_gb: int | None = Field(None, ge=1)
    # SQS queue fed by EventBridge with spot interruption and rebalance events.
    interruption_queue_url: str | None = None
    # Seconds a spot price lookup is reused; prices move hourly at most.
    price_cache_s: float = Field(300.0, ge=0)
    # botocore attempts per call (standard retry mode, which backs off on throttling).
    max_attempts: int = Field(3, ge=1)
    # Another EC2 endpoint (LocalStack, moto); None = AWS's.
    endpoint_url: str | None = None
    extra_tags: dict[str, str] = Field(default_factory=dict)
    # Where a gang (a launch of several nodes) goes: `{strategy: cluster}` = a cluster
    # placement group per gang, managed by the driver; a string = the name of an
    # existing cluster placement group every gang of this pool launches into (the
    # operator owns it); None = no placement group (the gang still shares one subnet).
    placement_group: (
        Annotated[
            Annotated[PlacementGroupOption, Tag("managed")] | Annotated[str, Tag("named")],
            Discriminator(lambda v: "named" if isinstance(v, str) else "managed"),
        ]
        | None
    ) = None
    # Seconds a managed placement group whose gang has no live instance is kept before
    # `list` deletes it: covers the moment between creating it and launching into it.
    placement_group_grace_s: float = Field(600.0, ge=0)
    # The region's public AWS certificate (PEM, inline or a file path): when set, an
    # agent registers only with an instance identity document it signs (identity.py).
    identity_certificate: str | None = None
    # With identity_certificate: the account the instances must belong to.
    identity_account_id: str | None = None


class AwsSettings(AwsOptions):
    region: str

    @classmethod
    def from_options(cls, region: str, options: Mapping[str, Any], *, image: str | None = None) -> AwsSettings:
        """Validate `options`; raises InvalidRequest with a message naming the bad key."""
        if not region or region == "local":
            raise InvalidRequest(
                "an AWS pool needs `region` (e.g. us-east-1)", scope=Scope.PROVIDER, code="InvalidConfig"
            )
        checked = parse_options(AwsOptions, "AWS", options)
        values = checked.model_dump()
        if image is not None:
            values["image"] = image
        return cls(region=region, **values)
