"""An Azure pool's settings: `AzureOptions` is the pool's `options:` block in the config
file, `AzureSettings` adds what comes from the pool itself (region as location, image).

A missing or mistyped key is refused with one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, field_validator

from providers.base import DriverOptions, parse_options


class AzureOptions(DriverOptions):
    subscription_id: str = Field(min_length=1)
    resource_group: str = Field(min_length=1)
    # A full resource id: the VNet may live in another resource group than the VMs.
    subnet_id: str
    ssh_public_key: str = Field(min_length=1)
    admin_username: str = "azureuser"
    os_disk_type: str = "StandardSSD_LRS"
    os_disk_size_gb: int = Field(128, ge=1)
    # Spot bid in USD/hour; -1 = pay up to the on-demand price and never be evicted for price.
    max_price: float = -1.0
    name_prefix: str = "as"
    # Only for tests and sovereign clouds; the public ARM endpoint otherwise.
    base_url: str | None = None
    # azure-core's own retries of 429/5xx before our typed error reaches the reconciler.
    sdk_retries: int = Field(3, ge=0)
    # A proximity placement group every gang VM joins: its name (in `resource_group`)
    # or its full resource id. The operator creates it (az ppg create); None = gangs
    # are only kept in one zone.
    proximity_placement_group: str | None = Field(None, min_length=1)

    @field_validator("subnet_id")
    @classmethod
    def _full_id(cls, value: str) -> str:
        if not value.startswith("/subscriptions/") or "/subnets/" not in value:
            raise ValueError("must be a full resource id (/subscriptions/.../subnets/NAME)")
        return value


class AzureSettings(AzureOptions):
    location: str
    image: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, region: str, image: str | None) -> AzureSettings:
        checked = parse_options(AzureOptions, "Azure", options)
        return cls(location=region, image=image, **checked.model_dump())
