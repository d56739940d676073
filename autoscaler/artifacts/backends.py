"""The store a server's config names (`artifacts.store`), opened."""

from __future__ import annotations

from pathlib import Path

from autoscaler.artifacts.store import ArtifactStore, LocalStore
from autoscaler.config import AutoscalerConfig
from autoscaler.errors import ConfigError


def open_store(config: AutoscalerConfig, home: Path) -> ArtifactStore:
    cfg = config.artifacts
    if cfg.store == "s3":
        from autoscaler.artifacts.s3 import S3Store

        if not cfg.bucket:
            raise ConfigError("artifacts.store is s3 but artifacts.bucket is not set: name the bucket")
        kw = {k: v for k, v in (("region_name", cfg.region), ("endpoint_url", cfg.endpoint_url)) if v}
        return S3Store(cfg.bucket, prefix=cfg.prefix, **kw)
    path = Path(cfg.path).expanduser()
    root = path if path.is_absolute() else home / path
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return LocalStore(root)
