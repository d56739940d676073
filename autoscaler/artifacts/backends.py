"""The store a server's config names (`artifacts.store`), opened."""

from __future__ import annotations

from pathlib import Path

from autoscaler.artifacts.store import ArtifactStore, LocalStore
from autoscaler.config import AutoscalerConfig


def open_store(config: AutoscalerConfig, home: Path) -> ArtifactStore:
    cfg = config.artifacts
    path = Path(cfg.path).expanduser()
    root = path if path.is_absolute() else home / path
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    return LocalStore(root)
