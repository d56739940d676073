"""A GCP pool's settings: `GcpOptions` is the pool's `options:` block in the config file,
`GcpSettings` adds what comes from the pool itself (region, zones, image).

A missing or mistyped key is refused with one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from providers.base import DriverOptions, InvalidRequest, Scope, parse_options


class GcpOptions(DriverOptions):
    # The project id the VMs are created in.
    project: str = Field(min_length=1)
    network: str = "global/networks/default"
    subnetwork: str | None = None
    service_account: str | None = None
    scopes: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)
    # An external IP lets a VM reach the control plane without Cloud NAT.
    external_ip: bool = True
    disk_size_gb: int = Field(100, ge=10)
    disk_type: str = "pd-balanced"
    name_prefix: str = "as"
    # instance type -> accelerator type, for N1-style shapes whose GPUs are attached
    # (A2/A3/G2 shapes carry their GPUs and need none).
    accelerator_types: dict[str, str] = Field(default_factory=dict)
    # DELETE frees the disk when GCP reclaims a spot VM; STOP would keep paying for it.
    spot_termination_action: Literal["DELETE", "STOP"] = "DELETE"
    # Only for tests and private endpoints; the SDK's default otherwise.
    api_endpoint: str | None = None
    # How long `launch` waits for the insert operation (capacity errors arrive there).
    operation_timeout_s: float = Field(120.0, gt=0)
    # A compact placement resource policy (group placement, collocation COLLOCATED) in
    # the pool's region that every gang VM joins: its name, or its full resource path.
    # The operator creates it (gcloud compute resource-policies create group-placement
    # NAME --collocation=collocated --region=R); None = gangs are only kept in one zone.
    placement_policy: str | None = Field(None, min_length=1)

    @field_validator("spot_termination_action", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value


class GcpSettings(GcpOptions):
    region: str
    zones: tuple[str, ...]
    image: str | None = None

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], *, region: str, zones: list[str] | tuple[str, ...], image: str | None
    ) -> GcpSettings:
        checked = parse_options(GcpOptions, "GCP", options)
        if not zones:
            raise InvalidRequest(
                f"GCP pool in region {region!r} needs at least one zone (zones: [{region}-a])",
                scope=Scope.PROVIDER,
                code="InvalidConfig",
            )
        return cls(region=region, zones=tuple(zones), image=image, **checked.model_dump())
