"""Turns a pool's configuration into a `Provider`: the one place that knows every backend.

A simple dispatch on `pool.provider`; each branch imports its package lazily so the
control plane starts without every cloud SDK. `providers.*` never import `autoscaler.*`,
so everything a driver needs from the configuration (the catalog of offerings, the
deployment's owner tag, the home directory) is handed to it here as plain values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoscaler.config import PoolConfig
from autoscaler.errors import ConfigError, MissingExtra
from providers.base import CapacityType, Offering, Provider


def catalog_offerings(pool: PoolConfig) -> list[Offering]:
    """Every (instance type x capacity type x zone) the pool declares, priced from the config.

    A spot price missing from the config falls back to the on-demand price: an upper
    bound (spot never costs more than on-demand), so budgets stay conservative until a
    driver reports the real price.
    """
    zones: list[str | None] = [*pool.zones] or [None]
    out: list[Offering] = []
    for capacity in pool.capacity_types:
        for itype in pool.instance_types:
            price = _price(itype.on_demand_price, itype.spot_price, capacity)
            for zone in zones:
                out.append(
                    Offering(
                        instance_type=itype.name,
                        capacity_type=capacity,
                        zone=zone,
                        gpus=itype.gpus,
                        gpu_type=itype.gpu_type,
                        cpus=itype.cpus,
                        memory_mb=itype.memory_mb,
                        hourly_price=price,
                        region=pool.region,
                    )
                )
    return out


def _price(on_demand: float | None, spot: float | None, capacity: CapacityType) -> float:
    if capacity == "spot" and spot is not None:
        return spot
    return on_demand if on_demand is not None else 0.0


def build_provider(pool: PoolConfig, *, deployment: str, home: Path, **kw: Any) -> Provider:
    """The provider for one pool. `kw` passes test seams (e.g. `clock`, `session`).

    Every driver is built the same way, `Driver(settings, offerings, *, seams)`, from
    its checked settings; a bad setting or a missing SDK becomes one line for the user.
    """
    from providers.base import MissingExtra as MissingSdk
    from providers.base import ProviderError

    try:
        return _build(pool, deployment=deployment, home=home, **kw)
    except MissingSdk as exc:
        raise MissingExtra(exc.extra, exc.package) from None
    except ProviderError as exc:
        raise ConfigError(f"pool {pool.name!r}: {exc.message}") from None


def _build(pool: PoolConfig, *, deployment: str, home: Path, **kw: Any) -> Provider:
    offerings = catalog_offerings(pool)
    kind = pool.provider
    if kind == "fake":
        from providers.fake import FakeProvider

        return FakeProvider(offerings, name=f"fake:{pool.name}", **kw)
    if kind == "local":
        from providers.local import LocalProvider

        return LocalProvider(
            offerings,
            pool=pool.name,
            home=home,
            simulated_gpus=pool.simulated_gpus.model_dump() if pool.simulated_gpus else None,
            labels=dict(pool.labels),
            **kw,
        )
    if kind == "aws":
        from providers.aws import AwsProvider, AwsSettings

        return AwsProvider(AwsSettings.from_options(pool.region, pool.options, image=pool.image), offerings, **kw)
    if kind == "gcp":
        from providers.gcp import GcpProvider, GcpSettings

        gcp = GcpSettings.from_options(pool.options, region=pool.region, zones=pool.zones, image=pool.image)
        return GcpProvider(gcp, offerings, **kw)
    if kind == "azure":
        from providers.azure import AzureProvider, AzureSettings

        azure = AzureSettings.from_options(pool.options, region=pool.region, image=pool.image)
        return AzureProvider(azure, offerings, **kw)
    if kind == "slurm":
        from providers.slurm import SlurmProvider, SlurmSettings

        slurm = SlurmSettings.from_options(pool.options, home=home, pool=pool.name, boot_timeout_s=pool.boot_timeout_s)
        return SlurmProvider(slurm, offerings)
    if kind == "static":
        from providers.static import StaticProvider, StaticSettings

        return StaticProvider(StaticSettings.from_options(pool.options), offerings, pool=pool.name, owner=deployment)
    raise ConfigError(
        f"pool {pool.name!r}: provider {kind!r} is not supported by this build; "
        "use one of: fake, local, aws, gcp, azure, slurm, static"
    )
