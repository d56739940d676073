"""The artifact store contract, on every backend (the local directory, moto's S3,
gcp-storage-emulator and Azurite): streamed writes answer size and digest, replace
atomically, refuse past a limit keeping the old object, and reads stream back what
was written. Then each cloud store's download URLs: a worker needs only the URL."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from autoscaler.artifacts.azure_blob import BLOCK_SIZE, AzureBlobStore
from autoscaler.artifacts.gcs import CHUNK, GCSStore
from autoscaler.artifacts.s3 import PART
from autoscaler.artifacts.store import ArtifactStore, LocalStore, ObjectMissing, StoreError, TooLarge
from tests.fakes.flaky_proxy import flaky_proxy
from tests.fakes.stores import STORES, azurite, gcs_url, moto_s3, open_test_store  # noqa: F401 - fixtures

# Every cloud store cuts a large write into parts of the same size (S3 parts, GCS
# resumable chunks, Azure blocks); the round trip below writes three, the last one short.
assert PART == CHUNK == BLOCK_SIZE


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    return open_test_store(request, request.param, tmp_path)


def blocks(data: bytes, size: int = 65536) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def test_put_get_round_trip_with_digest(store: ArtifactStore) -> None:
    data = os.urandom(2 * PART + 17)  # clouds: a multipart upload of three parts, the last one short
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


def test_a_large_write_is_staged_in_parts(store: ArtifactStore) -> None:
    """Where the emulator shows the parts (Azure's block list), three blocks were committed."""
    data = os.urandom(2 * PART + 17)
    store.put("k/parts", blocks(data))
    if isinstance(store, AzureBlobStore):
        committed, uncommitted = store._blob("k/parts").get_block_list("all")
        assert [b.size for b in committed] == [PART, PART, 17] and not uncommitted
    assert b"".join(store.get("k/parts")) == data


def test_download_urls_need_no_credentials(store: ArtifactStore) -> None:
    url = store.presigned_get("k/signed", 60)
    if isinstance(store, LocalStore):
        assert url is None  # the server relays local objects on a ticket
        return
    assert url is not None
    store.put("k/signed", [b"payload"])
    assert httpx.get(url).content == b"payload"  # a worker needs only the URL
    assert store.presigned_put("k/signed", 60) is None  # uploads go through the server


@pytest.fixture
def azure(request: pytest.FixtureRequest, tmp_path: Path) -> AzureBlobStore:
    store = open_test_store(request, "azure", tmp_path)
    assert isinstance(store, AzureBlobStore)
    return store


@pytest.fixture
def gcs(request: pytest.FixtureRequest, tmp_path: Path) -> GCSStore:
    store = open_test_store(request, "gcs", tmp_path)
    assert isinstance(store, GCSStore)
    return store


def test_azure_sas_is_read_only_for_one_blob_and_checked(azure: AzureBlobStore) -> None:
    """Azurite checks SAS signatures, permissions and expiry as Azure does."""
    store = azure
    store.put("k/one", [b"1"])
    store.put("k/two", [b"2"])
    url = httpx.URL(str(store.presigned_get("k/one", 60)))
    assert url.params["sp"] == "r" and url.params["sr"] == "b"
    assert store.service.credential.account_key not in str(url)  # signed with the key, not carrying it
    assert httpx.get(url).content == b"1"
    assert httpx.get(url.copy_with(path=url.path.replace("k/one", "k/two"))).status_code == 403
    assert httpx.put(url, content=b"x", headers={"x-ms-blob-type": "BlockBlob"}).status_code == 403
    assert httpx.delete(url).status_code == 403
    sig = url.params["sig"]
    # Another first character, always: a signature that already starts with the
    # replacement (one in 64) would be forged into itself, and the test would fail.
    forged = url.copy_set_param("sig", ("B" if sig[0] == "A" else "A") + sig[1:])
    assert forged.params["sig"] != sig
    assert httpx.get(forged).status_code == 403
    short = httpx.URL(str(store.presigned_get("k/one", 1)))
    time.sleep(2.1)
    assert httpx.get(short).status_code == 403  # expired
    assert b"".join(store.get("k/one")) == b"1"


def test_gcs_url_is_a_v4_signed_get_of_one_object(gcs: GCSStore) -> None:
    """gcp-storage-emulator checks no signature: what is tested is the URL the real V4
    signer makes (one object, GET, the expiry asked for, signed by the service account)
    and that the emulator serves it; that GCS refuses a forged or expired one is not."""
    store = gcs
    store.put("k/one", [b"1"])
    url = httpx.URL(str(store.presigned_get("k/one", 600)))
    assert url.path == f"/{store.bucket_name}/arts/k/one"
    assert url.params["X-Goog-Algorithm"] == "GOOG4-RSA-SHA256" and url.params["X-Goog-Expires"] == "600"
    assert url.params["X-Goog-Credential"].startswith("artifacts@") and len(url.params["X-Goog-Signature"]) == 512
    assert httpx.get(url).content == b"1"


def test_gcs_without_a_signing_credential_falls_back_to_the_relay(gcs: GCSStore) -> None:
    """Anonymous credentials cannot sign: no URL, so the server relays (never a credential)."""
    relayed = GCSStore(gcs.bucket_name, prefix="arts", client=gcs.client)
    assert relayed.presigned_get("k/one", 60) is None


def _through(direct: ArtifactStore, url: str, request: pytest.FixtureRequest) -> ArtifactStore:
    """The same bucket (container) as `direct`, reached through the proxy at `url`."""
    if isinstance(direct, GCSStore):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        options = {"api_endpoint": url}
        client = storage.Client(project="autoscaler-test", credentials=AnonymousCredentials(), client_options=options)
        return GCSStore(direct.bucket_name, prefix="arts", client=client)
    assert isinstance(direct, AzureBlobStore)
    from azure.storage.blob import BlobServiceClient, LinearRetry

    conn = request.getfixturevalue("azurite")
    endpoint = next(p for p in conn.split(";") if p.startswith("BlobEndpoint="))
    account = endpoint.rsplit("/", 1)[1]
    # The SDK's own retry, with a short backoff (the default policy waits 15 s or more per retry).
    fast = LinearRetry(backoff=0.2, random_jitter_range=0.1, retry_total=5)
    service = BlobServiceClient.from_connection_string(
        conn.replace(endpoint, f"BlobEndpoint={url}/{account}"), retry_policy=fast
    )
    return AzureBlobStore(direct.container_name, prefix="arts", service=service)


@pytest.mark.parametrize("kind", ["gcs", "azure"])
def test_writes_and_reads_survive_a_store_that_fails_every_third_request(
    request: pytest.FixtureRequest, tmp_path: Path, kind: str
) -> None:
    direct = open_test_store(request, kind, tmp_path)
    if isinstance(direct, GCSStore):
        upstream = request.getfixturevalue("gcs_url")
    else:
        assert isinstance(direct, AzureBlobStore)
        upstream = direct.service.url.rstrip("/").rsplit("/", 1)[0]
    data = os.urandom(2 * PART + 17)
    with flaky_proxy(upstream, every=3) as (url, proxy):
        store = _through(direct, url, request)
        w = store.put("k/flaky", blocks(data))
        assert b"".join(store.get("k/flaky")) == data
        assert store.exists("k/flaky")
    assert w.digest == "sha256:" + hashlib.sha256(data).hexdigest()
    assert b"".join(direct.get("k/flaky")) == data  # what was stored, read without the proxy
    assert len(proxy.failed) >= 2, proxy.failed  # the client met failures and retried them
