"""The store a server's config names (`artifacts.store`), opened.

Cloud SDKs are imported only for the store chosen, so a server with the local store
needs none of them; a missing one is a config error that names the extra to install.
"""

from __future__ import annotations

import os
from pathlib import Path

from autoscaler.artifacts.store import ArtifactStore, LocalStore
from autoscaler.config import AutoscalerConfig
from autoscaler.errors import ConfigError

# The extra (pyproject.toml) that brings each cloud store's SDK.
EXTRAS = {"s3": "aws", "gcs": "gcp", "azure": "azure"}


def open_store(config: AutoscalerConfig, home: Path) -> ArtifactStore:
    cfg = config.artifacts
    if cfg.store in EXTRAS:
        if not cfg.bucket:
            what = "container" if cfg.store == "azure" else "bucket"
            raise ConfigError(f"artifacts.store is {cfg.store} but artifacts.bucket is not set: name the {what}")
        try:
            return _cloud(cfg.store, cfg.bucket, cfg.prefix, cfg.region, cfg.project, cfg.endpoint_url)
        except ImportError as exc:
            raise ConfigError(
                f"artifacts.store is {cfg.store} but its SDK is not installed ({exc.name}): "
                f"pip install '.[{EXTRAS[cfg.store]}]'"
            ) from None
    path = Path(cfg.path).expanduser()
    root = path if path.is_absolute() else home / path
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return LocalStore(root)


def _cloud(
    store: str, bucket: str, prefix: str, region: str | None, project: str | None, endpoint_url: str | None
) -> ArtifactStore:
    if store == "s3":
        from autoscaler.artifacts.s3 import S3Store

        kw = {k: v for k, v in (("region_name", region), ("endpoint_url", endpoint_url)) if v}
        return S3Store(bucket, prefix=prefix, **kw)
    if store == "gcs":
        from autoscaler.artifacts.gcs import GCSStore

        return GCSStore(bucket, prefix=prefix, project=project, endpoint_url=endpoint_url)
    from autoscaler.artifacts.azure_blob import AzureBlobStore

    # The connection string holds the account key: it comes from the environment, never the config file.
    conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if not conn and not endpoint_url:
        raise ConfigError(
            "artifacts.store is azure: set artifacts.endpoint_url to the account's blob URL "
            "(https://ACCOUNT.blob.core.windows.net) or AZURE_STORAGE_CONNECTION_STRING in the server's environment"
        )
    return AzureBlobStore(bucket, prefix=prefix, connection_string=conn, account_url=endpoint_url)
