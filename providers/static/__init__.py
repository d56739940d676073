"""On-prem static pools: machines that already exist and are already paid for.

The machines are declared in the pool's `options.machines` (name, GPUs) or simply
register with the pool's join token; either way they count as capacity and the planner
fills them first (a static pool costs nothing to use). The reconciler never launches or
terminates them, only drains their workers: `launch` is refused and `terminate` does
nothing, so no code path can power off a machine someone else owns.

Gangs: a multi-node task runs on the pool's machines that are already registered (the
control plane leases its ranks onto them); a gang launch is refused like any launch,
with the reason. With declared machines, `max_gang_nodes` is their count, so the
planner knows a gang wider than the list can never run here.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from providers.static.settings import StaticMachine, StaticOptions, StaticSettings


class StaticProvider:
    """The declared machines of one on-prem pool; see the module docstring."""

    name = "static"

    def __init__(self, settings: StaticSettings, offerings: Sequence[Offering], *, pool: str, owner: str) -> None:
        self.settings = settings
        self.machines = list(settings.machines)
        # Machines may also join by token without being declared: then no stated limit.
        self.capabilities = Capabilities(static=True, max_gang_nodes=len(self.machines) or None)
        self.pool = pool
        self.owner = owner
        self._offerings = list(offerings)

    def offerings(self) -> list[Offering]:
        return list(self._offerings)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        if request.nodes > 1:
            fits = (
                f"its {len(self.machines)} declared machine(s) cannot hold a gang of {request.nodes}"
                if len(self.machines) < request.nodes
                else f"a gang of {request.nodes} runs on {request.nodes} of its registered machines when they are idle"
            )
            raise InvalidRequest(
                f"pool {self.pool!r} is static (on-prem) and launches no machines: {fits}",
                scope=Scope.PROVIDER,
                code="StaticPool",
            )
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


__all__ = ["StaticMachine", "StaticOptions", "StaticProvider", "StaticSettings"]
