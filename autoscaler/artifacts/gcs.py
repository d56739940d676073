"""The artifact store on Google Cloud Storage, with google-cloud-storage.

Writes stream as one resumable upload (8 MiB chunks, so nothing larger is held in
memory) that is finalized only by its last chunk: a failed or oversized write is
cancelled and the old object stays. Every chunk and request is retried by the
library's own policy (exponential backoff on 429, 5xx and connection errors).
Reads stream in ranged requests of one block each.

Workers download code and checkpoints on V4 signed URLs (GET only, one object, a
short expiry); their uploads are relayed by the server, which records and checks
them. Signing needs a credential that can sign: a service-account key, or on GCE and
GKE the metadata server's account through the IAM signBlob call (the server's
account then needs `iam.serviceAccounts.signBlob` on itself). Where neither works,
`presigned_get` answers None and the server relays downloads too, on a ticket: a
worker never gets a store credential either way.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

from autoscaler.artifacts.store import BLOCK, ObjectMissing, StoreError, Written, bounded

log = logging.getLogger(__name__)
CHUNK = 8 * 1024 * 1024  # a multiple of the 256 KiB that resumable uploads require


class GCSStore:
    name = "gcs"

    def __init__(
        self,
        bucket: str,
        *,
        prefix: str = "",
        client: Any = None,
        project: str | None = None,
        endpoint_url: str | None = None,
        signing_endpoint: str | None = None,
        signing_credentials: Any = None,
    ) -> None:
        if client is None:
            from google.cloud import storage

            options = {"api_endpoint": endpoint_url} if endpoint_url else None
            client = storage.Client(project=project, client_options=options)
        self.client = client
        self.bucket_name = bucket
        self.bucket = client.bucket(bucket)
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        # Where signed URLs point: the public endpoint unless another one is named (an emulator).
        self.signing_endpoint = signing_endpoint or endpoint_url
        # What signs download URLs: the client's own credentials unless others are given.
        self.signing_credentials = signing_credentials

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(self.prefix + key, chunk_size=CHUNK)

    def _fail(self, what: str, key: str, exc: Exception) -> StoreError:
        return StoreError(f"GCS bucket {self.bucket_name}: cannot {what} {key}: {exc}")

    def put(self, key: str, blocks: Iterable[bytes], *, limit_bytes: int | None = None) -> Written:
        from google.api_core.exceptions import GoogleAPICallError
        from google.cloud.storage.retry import DEFAULT_RETRY

        h = hashlib.sha256()
        size = 0
        writer: Any = None
        try:
            # Not idempotent in general, but replacing this key is what we want either way.
            writer = self._blob(key).open("wb", chunk_size=CHUNK, retry=DEFAULT_RETRY)
            for block in bounded(blocks, limit_bytes):
                h.update(block)
                size += len(block)
                writer.write(block)
            writer.close()  # the last chunk finalizes the object
        except BaseException as exc:
            if writer is not None and not writer.closed:
                # An upload never finalized is discarded by GCS within a week anyway.
                with contextlib.suppress(Exception):
                    writer.terminate()
            if isinstance(exc, Exception) and (isinstance(exc, GoogleAPICallError | OSError) or _is_transport(exc)):
                raise self._fail("write", key, exc) from None
            raise
        return Written(size=size, digest=f"sha256:{h.hexdigest()}")

    def get(self, key: str) -> Iterator[bytes]:
        from google.api_core.exceptions import GoogleAPICallError, NotFound

        blob = self._blob(key)
        try:
            reader = blob.open("rb", chunk_size=BLOCK)
            first = reader.read(BLOCK)  # a missing object is known now, not mid-stream
        except NotFound:
            raise ObjectMissing(f"{key} is not in the artifact store (deleted by retention?)") from None
        except GoogleAPICallError as exc:
            raise self._fail("read", key, exc) from None
        return _chunks(reader, first)

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import GoogleAPICallError, NotFound

        try:
            self._blob(key).delete()
        except NotFound:
            return
        except GoogleAPICallError as exc:
            raise self._fail("delete", key, exc) from None

    def exists(self, key: str) -> bool:
        return bool(self._blob(key).exists())

    def presigned_get(self, key: str, ttl_s: int) -> str | None:
        kw: dict[str, Any] = {"version": "v4", "expiration": timedelta(seconds=ttl_s), "method": "GET"}
        if self.signing_endpoint:
            kw["api_access_endpoint"] = self.signing_endpoint
        creds = self.signing_credentials or self.client._credentials
        kw["credentials"] = creds
        if not hasattr(creds, "sign_bytes"):
            # Metadata-server credentials cannot sign locally: sign through IAM with a token.
            import google.auth.transport.requests

            with contextlib.suppress(Exception):
                creds.refresh(google.auth.transport.requests.Request())
            kw["service_account_email"] = getattr(creds, "service_account_email", None)
            kw["access_token"] = getattr(creds, "token", None)
        try:
            url: str = self._blob(key).generate_signed_url(**kw)
        except Exception as exc:
            log.warning(
                "GCS bucket %s: cannot sign a URL (%s); the server relays downloads instead", self.bucket_name, exc
            )
            return None
        return url

    def presigned_put(self, key: str, ttl_s: int) -> str | None:
        return None  # uploads are relayed: the server records and checks what is stored


def _is_transport(exc: BaseException) -> bool:
    """A connection-level failure from the HTTP stack (requests, google-resumable-media)."""
    mod = type(exc).__module__
    return mod.startswith(("requests.", "google.resumable_media", "google.auth.exceptions", "urllib3."))


def _chunks(reader: Any, first: bytes) -> Iterator[bytes]:
    try:
        block = first
        while block:
            yield block
            block = reader.read(BLOCK)
    finally:
        reader.close()
