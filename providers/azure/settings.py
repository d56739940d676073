"""An Azure pool's settings, read from the pool's `options` mapping in the config file.

A frozen dataclass rather than the control plane's config model (providers do not import
it); a missing or mistyped key is refused with one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from providers.base import InvalidRequest, Scope

_KNOWN = {
    "subscription_id",
    "resource_group",
    "subnet_id",
    "admin_username",
    "ssh_public_key",
    "os_disk_type",
    "os_disk_size_gb",
    "max_price",
    "name_prefix",
    "base_url",
    "sdk_retries",
}


@dataclass(frozen=True)
class AzureSettings:
    subscription_id: str
    resource_group: str
    location: str
    subnet_id: str
    ssh_public_key: str
    image: str | None = None
    admin_username: str = "azureuser"
    os_disk_type: str = "StandardSSD_LRS"
    os_disk_size_gb: int = 128
    # Spot bid in USD/hour; -1 = pay up to the on-demand price and never be evicted for price.
    max_price: float = -1.0
    name_prefix: str = "as"
    # Only for tests and sovereign clouds; the public ARM endpoint otherwise.
    base_url: str | None = None
    # azure-core's own retries of 429/5xx before our typed error reaches the reconciler.
    sdk_retries: int = 3

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, region: str, image: str | None) -> AzureSettings:
        unknown = sorted(set(options) - _KNOWN)
        if unknown:
            raise _bad(f"unknown Azure pool option(s) {unknown}; known: {sorted(_KNOWN)}")
        for key in ("subscription_id", "resource_group", "subnet_id", "ssh_public_key"):
            if not isinstance(options.get(key), str) or not options[key]:
                raise _bad(f"an Azure pool needs options.{key}")
        if not str(options["subnet_id"]).startswith("/subscriptions/"):
            raise _bad("options.subnet_id must be a full resource id (/subscriptions/.../subnets/NAME)")
        try:
            return cls(
                subscription_id=options["subscription_id"],
                resource_group=options["resource_group"],
                location=region,
                subnet_id=options["subnet_id"],
                ssh_public_key=options["ssh_public_key"],
                image=image,
                admin_username=str(options.get("admin_username", "azureuser")),
                os_disk_type=str(options.get("os_disk_type", "StandardSSD_LRS")),
                os_disk_size_gb=int(options.get("os_disk_size_gb", 128)),
                max_price=float(options.get("max_price", -1.0)),
                name_prefix=str(options.get("name_prefix", "as")),
                base_url=options.get("base_url"),
                sdk_retries=int(options.get("sdk_retries", 3)),
            )
        except (TypeError, ValueError) as exc:
            raise _bad(f"invalid Azure pool option: {exc}") from None


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, scope=Scope.PROVIDER, code="InvalidConfig")
