"""The default simulated world: V100 pools on two clouds priced from the shared price
catalog (`shared/data/prices/fsdl-cloud-gpus/cloud-gpus.csv`, about October 2023), in
zones with different spot reclaim rates.

- AWS, us-west-2: p3.2xlarge, p3.8xlarge, p3.16xlarge (1, 4, 8 V100), zones a, b, c at
  the reclaims per up-hour the public p3.2xlarge traces measured there (0.16, 0.10,
  0.15; shared/data/README.md).
- Azure, eastus: NC6s v3, NC12s v3, NC24s v3 (1, 2, 4 V100), three zones. No public
  Azure trace exists, so their rates are the AWS us-east-1 zones' (c 0.67, d 0.60,
  f 0.44): the harsh end of the same table, giving a spread of more than 6x.

V100 is the GPU the Philly run times are measured on. `default_config` builds a whole
`AutoscalerConfig` for a workload: its teams, one `gpu` queue over both pools, the fake
provider standing in for each cloud; `DEFAULT_ZONE_RATES` is the matching
`SimSettings.preemption_by_zone`.
"""

from __future__ import annotations

import csv
from pathlib import Path

from autoscaler.config import AutoscalerConfig, InstanceTypeConfig, PoolConfig, QueueConfig, TeamConfig
from autoscaler.errors import InvalidInput

# Relative to the repository root: the repository and shared/ are siblings.
DEFAULT_CATALOG = Path("..") / "shared" / "data" / "prices" / "fsdl-cloud-gpus" / "cloud-gpus.csv"
DEFAULT_CLOUD = "AWS"
DEFAULT_GPU = "V100 (16 GB)"
# (pool, catalog cloud, region, {zone: reclaims per spot instance-hour})
DEFAULT_POOLS: tuple[tuple[str, str, str, dict[str, float]], ...] = (
    ("aws-v100", "AWS", "us-west-2", {"us-west-2a": 0.16, "us-west-2b": 0.10, "us-west-2c": 0.15}),
    ("azure-v100", "Azure", "eastus", {"eastus-1": 0.67, "eastus-2": 0.60, "eastus-3": 0.44}),
)
DEFAULT_ZONE_RATES: dict[str, float] = {z: r for _, _, _, rates in DEFAULT_POOLS for z, r in rates.items()}


def catalog_instance_types(
    path: Path = DEFAULT_CATALOG, *, cloud: str = DEFAULT_CLOUD, gpu: str = DEFAULT_GPU
) -> list[InstanceTypeConfig]:
    """Instance types of one cloud and GPU from the catalog (duplicate rows dropped)."""
    try:
        rows = list(csv.DictReader(path.open(newline="")))
    except OSError as exc:
        raise InvalidInput(
            f"price catalog {path}: cannot read it ({exc.strerror}); expected the cloud-gpus.csv "
            "of shared/data/prices/fsdl-cloud-gpus (run from the repository root)"
        ) from None
    out: dict[str, InstanceTypeConfig] = {}
    for r in rows:
        if r.get("Cloud") != cloud or r.get("GPU Type") != gpu or r["Name"] in out:
            continue
        spot = float(r["Spot"]) if r.get("Spot") else None
        out[r["Name"]] = InstanceTypeConfig(
            name=r["Name"],
            gpus=int(r["GPUs"]),
            gpu_type=gpu.split(" ")[0],
            cpus=int(float(r["vCPUs"])),
            memory_mb=int(float(r["RAM"]) * 1024),
            on_demand_price=float(r["On-demand"]),
            spot_price=spot,
        )
    if not out:
        raise InvalidInput(f"price catalog {path}: no {cloud} rows with GPU type {gpu!r}")
    return sorted(out.values(), key=lambda t: (t.gpus, t.name))


def default_config(
    teams: tuple[str, ...],
    *,
    catalog: Path = DEFAULT_CATALOG,
    max_instances: int = 5000,
    idle_timeout_s: float = 300.0,
) -> AutoscalerConfig:
    pools = [
        PoolConfig(
            name=name,
            provider="fake",
            region=region,
            zones=list(rates),
            instance_types=catalog_instance_types(catalog, cloud=cloud),
            max_instances=max_instances,
            idle_timeout_s=idle_timeout_s,
        )
        for name, cloud, region, rates in DEFAULT_POOLS
    ]
    return AutoscalerConfig(
        deployment="sim",
        teams=[TeamConfig(name=t) for t in teams],
        queues=[QueueConfig(name="gpu", pools=[p.name for p in pools])],
        pools=pools,
    )
