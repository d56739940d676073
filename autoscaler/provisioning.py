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
    """The provider for one pool. `kw` passes test seams (e.g. `clock`, `endpoint_url`)."""
    kind = pool.provider
    if kind == "fake":
        from providers.fake import FakeProvider

        return FakeProvider(catalog_offerings(pool), name=f"fake:{pool.name}", **kw)
    if kind == "local":
        from providers.local import LocalProvider

        return LocalProvider(
            catalog_offerings(pool),
            pool=pool.name,
            home=home,
            simulated_gpus=pool.simulated_gpus.model_dump() if pool.simulated_gpus else None,
            labels=dict(pool.labels),
            **kw,
        )
    if kind == "aws":
        try:
            from providers.aws import AwsProvider, AwsSettings

            settings = AwsSettings.from_options(pool.region, pool.options, image=pool.image)
            return AwsProvider(settings, catalog=catalog_offerings(pool), **kw)
        except ImportError:
            raise MissingExtra("aws", "boto3") from None
        except ValueError as exc:
            raise ConfigError(f"pool {pool.name!r}: {exc}") from None
    if kind in ("gcp", "azure", "slurm", "static"):
        return _build_other(pool, deployment=deployment, home=home, **kw)
    raise ConfigError(
        f"pool {pool.name!r}: provider {kind!r} is not supported by this build; "
        "use one of: fake, local, aws, gcp, azure, slurm, static"
    )


def _build_other(pool: PoolConfig, *, deployment: str, home: Path, **kw: Any) -> Provider:
    """GCP, Azure, Slurm and static pools; their settings errors become one-line ConfigErrors."""
    from providers.base import ProviderError

    offerings = catalog_offerings(pool)
    try:
        if pool.provider == "gcp":
            from providers.gcp import GcpProvider, GcpSettings

            gcp = GcpSettings.from_options(pool.options, region=pool.region, zones=pool.zones, image=pool.image)
            return GcpProvider(gcp, offerings, **kw)
        if pool.provider == "azure":
            from providers.azure import AzureProvider, AzureSettings

            azure = AzureSettings.from_options(pool.options, region=pool.region, image=pool.image)
            return AzureProvider(azure, offerings, **kw)
        if pool.provider == "slurm":
            from providers.slurm import SlurmProvider, SlurmSettings

            slurm = SlurmSettings.from_options(
                pool.options, home=home, pool=pool.name, boot_timeout_s=pool.boot_timeout_s
            )
            return SlurmProvider(slurm, offerings)
        from providers.static import StaticProvider

        return StaticProvider(pool.name, deployment, offerings, pool.options)
    except ProviderError as exc:
        if exc.code == "MissingExtra":
            module = {"gcp": "google-cloud-compute", "azure": "azure-mgmt-compute"}.get(pool.provider, "")
            raise MissingExtra(pool.provider, module) from None
        raise ConfigError(f"pool {pool.name!r}: {exc.message}") from None
