"""On-prem static pools: machines that already exist and are already paid for.

The machines are declared in the pool's `options.machines` (name, GPUs) or simply
register with the pool's join token; either way they count as capacity and the planner
fills them first (a static pool costs nothing to use). The reconciler never launches or
terminates them, only drains their workers: `launch` is refused and `terminate` does
nothing, so no code path can power off a machine someone else owns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from providers.base import (
    TAG_OWNER,
    TAG_POOL,
    Capabilities,
    InstanceStatus,
    InvalidRequest,
    LaunchRequest,
    Offering,
    ProviderInstance,
    Scope,
)


@dataclass(frozen=True)
class StaticMachine:
    name: str
    gpus: int = 0
    gpu_type: str | None = None

    @classmethod
    def parse(cls, raw: Any, index: int) -> StaticMachine:
        if isinstance(raw, str):
            return cls(raw)
        if not isinstance(raw, Mapping) or not isinstance(raw.get("name"), str):
            raise InvalidRequest(
                f"options.machines[{index}] must be a name or {{name, gpus, gpu_type}}",
                scope=Scope.PROVIDER,
                code="InvalidConfig",
            )
        unknown = sorted(set(raw) - {"name", "gpus", "gpu_type"})
        if unknown:
            raise InvalidRequest(
                f"options.machines[{index}] has unknown key(s) {unknown}", scope=Scope.PROVIDER, code="InvalidConfig"
            )
        gpus = raw.get("gpus", 0)
        if not isinstance(gpus, int) or gpus < 0:
            raise InvalidRequest(
                f"options.machines[{index}].gpus must be a whole number >= 0",
                scope=Scope.PROVIDER,
                code="InvalidConfig",
            )
        return cls(raw["name"], gpus, raw.get("gpu_type"))


class StaticProvider:
    """The declared machines of one on-prem pool; see the module docstring."""

    name = "static"
    capabilities = Capabilities(static=True)

    def __init__(self, pool: str, owner: str, offerings: Sequence[Offering], options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - {"machines"})
        if unknown:
            raise InvalidRequest(
                f"unknown static pool option(s) {unknown}; known: ['machines']",
                scope=Scope.PROVIDER,
                code="InvalidConfig",
            )
        raw = options.get("machines", [])
        if not isinstance(raw, list):
            raise InvalidRequest("options.machines must be a list", scope=Scope.PROVIDER, code="InvalidConfig")
        self.machines = [StaticMachine.parse(m, i) for i, m in enumerate(raw)]
        names = [m.name for m in self.machines]
        if len(set(names)) != len(names):
            raise InvalidRequest(
                f"options.machines names must be unique: {names}", scope=Scope.PROVIDER, code="InvalidConfig"
            )
        self.pool = pool
        self.owner = owner
        self._offerings = list(offerings)

    def offerings(self) -> list[Offering]:
        return list(self._offerings)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        raise InvalidRequest(
            f"pool {self.pool!r} is static (on-prem): machines join with the pool's join token, "
            "they are never launched",
            scope=Scope.PROVIDER,
            code="StaticPool",
        )

    def list(self, owner: str) -> list[ProviderInstance]:
        if owner != self.owner:
            return []
        return [
            ProviderInstance(
                instance_id=m.name,
                request_id=None,
                pool=self.pool,
                instance_type=f"static.{m.gpus}gpu",
                capacity_type="on_demand",
                zone=None,
                status=InstanceStatus.RUNNING,
                tags={TAG_OWNER: self.owner, TAG_POOL: self.pool},
            )
            for m in self.machines
        ]

    def terminate(self, instance_ids: Sequence[str]) -> None:
        # Never power off an on-prem machine: scale-down of a static pool is a drain only.
        return None


__all__ = ["StaticMachine", "StaticProvider"]
