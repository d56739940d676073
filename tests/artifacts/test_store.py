"""The artifact store contract, on every backend: streamed writes answer size and
digest, replace atomically, refuse past a limit keeping the old object, and reads
stream back what was written."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.artifacts.s3 import PART
from autoscaler.artifacts.store import ArtifactStore, LocalStore, ObjectMissing, StoreError, TooLarge
from tests.fakes.s3 import moto_s3_server, s3_store


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    with moto_s3_server() as url:
        yield url


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    return s3_store(request.getfixturevalue("moto_s3"))


def blocks(data: bytes, size: int = 65536) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_put_get_round_trip_with_digest(store: ArtifactStore) -> None:
    data = os.urandom(2 * PART + 17)  # S3: a multipart upload of three parts, the last one short
    w = store.put("tasks/t1/1/output/abc", blocks(data))
    assert (w.size, w.digest) == (len(data), "sha256:" + hashlib.sha256(data).hexdigest())
    assert b"".join(store.get("tasks/t1/1/output/abc")) == data
    assert store.exists("tasks/t1/1/output/abc")


def test_over_the_limit_keeps_the_old_object(store: ArtifactStore) -> None:
    store.put("k/one", [b"old"])
    with pytest.raises(TooLarge, match="10 bytes"):
        store.put("k/one", blocks(b"x" * 100, 4), limit_bytes=10)
    assert b"".join(store.get("k/one")) == b"old"


def test_a_failing_source_keeps_the_old_object(store: ArtifactStore) -> None:
    store.put("k/two", [b"old"])

    def broken() -> Iterator[bytes]:
        yield b"new"
        raise RuntimeError("client went away")

    with pytest.raises(RuntimeError):
        store.put("k/two", broken())
    assert b"".join(store.get("k/two")) == b"old"


def test_missing_and_deleted(store: ArtifactStore) -> None:
    with pytest.raises(ObjectMissing, match="not in the artifact store"):
        list(store.get("nope/x"))
    store.put("k/three", [b"1"])
    store.delete("k/three")
    store.delete("k/three")  # twice: no error
    assert not store.exists("k/three")


def test_local_keys_cannot_leave_the_root(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for key in ("../escape", "a/../../b", "/abs", "", "a//b"):
        with pytest.raises(StoreError, match="invalid store key"):
            store.put(key, [b"x"])
    assert not (tmp_path / "escape").exists()


def test_s3_presigned_get_needs_no_credentials(store: ArtifactStore) -> None:
    import httpx

    url = store.presigned_get("k/signed", 60)
    if url is None:
        assert isinstance(store, LocalStore)  # the server relays local objects on a ticket
        return
    store.put("k/signed", [b"payload"])
    assert httpx.get(url).content == b"payload"  # a worker needs only the URL
    assert store.presigned_put("k/signed", 60) is None  # uploads go through the server
