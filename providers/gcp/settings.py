"""A GCP pool's settings, read from the pool's `options` mapping in the config file.

Kept as a small frozen dataclass (providers do not import the control plane's config
models); a missing or mistyped key is refused with one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from providers.base import InvalidRequest, Scope

_KNOWN = {
    "project",
    "network",
    "subnetwork",
    "service_account",
    "scopes",
    "external_ip",
    "disk_size_gb",
    "disk_type",
    "name_prefix",
    "accelerator_types",
    "spot_termination_action",
    "api_endpoint",
    "operation_timeout_s",
}


@dataclass(frozen=True)
class GcpSettings:
    project: str
    region: str
    zones: tuple[str, ...]
    image: str | None = None
    network: str = "global/networks/default"
    subnetwork: str | None = None
    service_account: str | None = None
    scopes: tuple[str, ...] = ("https://www.googleapis.com/auth/cloud-platform",)
    # An external IP lets a VM reach the control plane without Cloud NAT.
    external_ip: bool = True
    disk_size_gb: int = 100
    disk_type: str = "pd-balanced"
    name_prefix: str = "as"
    # instance type -> accelerator type, for N1-style shapes whose GPUs are attached
    # (A2/A3/G2 shapes carry their GPUs and need none).
    accelerator_types: Mapping[str, str] = field(default_factory=dict)
    # DELETE frees the disk when GCP reclaims a spot VM; STOP would keep paying for it.
    spot_termination_action: str = "DELETE"
    # Only for tests and private endpoints; the SDK's default otherwise.
    api_endpoint: str | None = None
    # How long `launch` waits for the insert operation (capacity errors arrive there).
    operation_timeout_s: float = 120.0

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], *, region: str, zones: list[str] | tuple[str, ...], image: str | None
    ) -> GcpSettings:
        unknown = sorted(set(options) - _KNOWN)
        if unknown:
            raise _bad(f"unknown GCP pool option(s) {unknown}; known: {sorted(_KNOWN)}")
        project = options.get("project")
        if not isinstance(project, str) or not project:
            raise _bad("a GCP pool needs options.project (the project id)")
        if not zones:
            raise _bad(f"GCP pool in region {region!r} needs at least one zone (zones: [{region}-a])")
        action = str(options.get("spot_termination_action", "DELETE")).upper()
        if action not in ("DELETE", "STOP"):
            raise _bad(f"options.spot_termination_action must be DELETE or STOP, got {action!r}")
        accel = options.get("accelerator_types", {})
        if not isinstance(accel, Mapping):
            raise _bad("options.accelerator_types must map instance type -> accelerator type")
        try:
            return cls(
                project=project,
                region=region,
                zones=tuple(zones),
                image=image,
                network=str(options.get("network", cls.network)),
                subnetwork=options.get("subnetwork"),
                service_account=options.get("service_account"),
                scopes=tuple(options.get("scopes", cls.scopes)),
                external_ip=bool(options.get("external_ip", True)),
                disk_size_gb=int(options.get("disk_size_gb", 100)),
                disk_type=str(options.get("disk_type", "pd-balanced")),
                name_prefix=str(options.get("name_prefix", "as")),
                accelerator_types={str(k): str(v) for k, v in accel.items()},
                spot_termination_action=action,
                api_endpoint=options.get("api_endpoint"),
                operation_timeout_s=float(options.get("operation_timeout_s", 120.0)),
            )
        except (TypeError, ValueError) as exc:
            raise _bad(f"invalid GCP pool option: {exc}") from None


def _bad(message: str) -> InvalidRequest:
    return InvalidRequest(message, scope=Scope.PROVIDER, code="InvalidConfig")
