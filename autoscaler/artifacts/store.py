"""The artifact store interface and its local-directory backend.

A store keeps opaque objects under string keys. Writes stream from an iterator of
byte blocks and answer the size and SHA-256 digest of what was stored, computed on
the way (no object is ever held whole in memory); reads stream blocks back. Keys are
made by the server (`records`), never taken from a request, but the local backend
still refuses any key that would leave its root.

Backends that can hand a worker a presigned URL (S3, GCS, Azure) answer
`presigned_get`/`presigned_put`; the local backend answers None and the server
serves the transfer itself, authorized by a ticket (`tickets`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from autoscaler.errors import AutoscalerError

BLOCK = 1024 * 1024


class StoreError(AutoscalerError):
    """The store failed to keep or give back an object (disk full, cloud refused)."""

    http_status = 503


class ObjectMissing(AutoscalerError):
    http_status = 404


class TooLarge(AutoscalerError):
    http_status = 413


@dataclass(frozen=True)
class Written:
    size: int
    digest: str  # "sha256:<hex>"


class ArtifactStore(Protocol):
    name: str

    def put(self, key: str, blocks: Iterable[bytes], *, limit_bytes: int | None = None) -> Written:
        """Store the blocks under key (replacing what was there), atomically: a failed
        or oversized write leaves the old object, or none."""
        ...

    def get(self, key: str) -> Iterator[bytes]:
        """The object's blocks; ObjectMissing when there is none."""
        ...

    def delete(self, key: str) -> None: ...

    def exists(self, key: str) -> bool: ...

    def presigned_get(self, key: str, ttl_s: int) -> str | None: ...

    def presigned_put(self, key: str, ttl_s: int) -> str | None: ...


def bounded(blocks: Iterable[bytes], limit_bytes: int | None = None) -> Iterator[bytes]:
    """Pass the blocks through; TooLarge once they add up past the limit."""
    size = 0
    for block in blocks:
        size += len(block)
        if limit_bytes is not None and size > limit_bytes:
            raise TooLarge(f"the upload is larger than the {limit_bytes} bytes allowed")
        yield block


class LocalStore:
    """Objects as files under a root directory (default HOME/artifacts)."""

    name = "local"

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or "\x00" in key:
            raise StoreError(f"invalid store key {key!r}")
        return self.root.joinpath(*parts)

    def put(self, key: str, blocks: Iterable[bytes], *, limit_bytes: int | None = None) -> Written:
        path = self._path(key)
        h = hashlib.sha256()
        size = 0
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.{id(blocks)}.part")
            try:
                with tmp.open("wb") as fh:
                    for block in bounded(blocks, limit_bytes):
                        size += len(block)
                        h.update(block)
                        fh.write(block)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)  # readers see the old object or the whole new one
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
        except OSError as exc:
            raise StoreError(f"local artifact store {self.root}: cannot write {key}: {exc.strerror or exc}") from None
        return Written(size=size, digest=f"sha256:{h.hexdigest()}")

    def get(self, key: str) -> Iterator[bytes]:
        path = self._path(key)
        try:
            fh = path.open("rb")
        except FileNotFoundError:
            raise ObjectMissing(f"{key} is not in the artifact store (deleted by retention?)") from None
        except OSError as exc:
            raise StoreError(f"local artifact store {self.root}: cannot read {key}: {exc.strerror or exc}") from None
        return _read_blocks(fh)

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(key).unlink()

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def presigned_get(self, key: str, ttl_s: int) -> str | None:
        return None  # the server serves local objects itself, on a ticket

    def presigned_put(self, key: str, ttl_s: int) -> str | None:
        return None


def _read_blocks(fh: BinaryIO) -> Iterator[bytes]:
    with fh:
        while block := fh.read(BLOCK):
            yield block
