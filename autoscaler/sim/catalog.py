"""The default simulated fleet: one pool priced from the shared price catalog
(`shared/data/prices/fsdl-cloud-gpus/cloud-gpus.csv`, about October 2023).

The default pool is AWS's V100 family (1, 4 and 8 GPUs), the GPU the Philly run times
are measured on. `default_config` builds a whole `AutoscalerConfig` for a workload:
its teams, one `gpu` queue and that pool, with the fake provider standing in for AWS.
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
DEFAULT_ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


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
    pool = PoolConfig(
        name="aws-v100",
        provider="fake",
        region="us-east-1",
        zones=list(DEFAULT_ZONES),
        instance_types=catalog_instance_types(catalog),
        max_instances=max_instances,
        idle_timeout_s=idle_timeout_s,
    )
    return AutoscalerConfig(
        deployment="sim",
        teams=[TeamConfig(name=t) for t in teams],
        queues=[QueueConfig(name="gpu", pools=[pool.name])],
        pools=[pool],
    )
