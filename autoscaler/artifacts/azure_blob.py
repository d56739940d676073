"""The artifact store on Azure Blob Storage, with azure-storage-blob.

Writes stream as a block blob: each 8 MiB block is staged as it arrives (nothing
larger is held in memory) and the block list is committed only at the end, so a
failed or oversized write commits nothing and the old blob stays (Azure discards
uncommitted blocks after a week). Every request is retried by the SDK's
exponential retry policy (5 tries). Reads stream the blob in chunks.

Workers download code and checkpoints on SAS URLs: read permission on that one blob,
a short expiry. Signed with the account key when the server has one (a connection
string), else with a user delegation key fetched with the server's Entra ID
identity (DefaultAzureCredential; it needs "Storage Blob Delegator"). Their uploads
are relayed by the server, which records and checks them. A worker never gets the
account key or a token.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from autoscaler.artifacts.store import ObjectMissing, StoreError, Written, bounded

log = logging.getLogger(__name__)
BLOCK_SIZE = 8 * 1024 * 1024
RETRIES = 5


class AzureBlobStore:
    name = "azure"

    def __init__(
        self,
        container: str,
        *,
        prefix: str = "",
        service: Any = None,
        connection_string: str | None = None,
        account_url: str | None = None,
    ) -> None:
        if service is None:
            from azure.storage.blob import BlobServiceClient

            if connection_string:
                service = BlobServiceClient.from_connection_string(connection_string, retry_total=RETRIES)
            elif account_url:
                from azure.identity import DefaultAzureCredential

                service = BlobServiceClient(account_url, credential=DefaultAzureCredential(), retry_total=RETRIES)
            else:
                raise StoreError(
                    "the Azure artifact store needs an account: set artifacts.endpoint_url to the account's blob URL "
                    "(https://ACCOUNT.blob.core.windows.net) or AZURE_STORAGE_CONNECTION_STRING in the server's "
                    "environment"
                )
        self.service = service
        self.container_name = container
        self.container = service.get_container_client(container)
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self._delegation: tuple[Any, datetime] | None = None

    def _blob(self, key: str) -> Any:
        return self.container.get_blob_client(self.prefix + key)

    def _fail(self, what: str, key: str, exc: Exception) -> StoreError:
        return StoreError(f"Azure container {self.container_name}: cannot {what} {key}: {_short(exc)}")

    def put(self, key: str, blocks: Iterable[bytes], *, limit_bytes: int | None = None) -> Written:
        from azure.core.exceptions import AzureError
        from azure.storage.blob import BlobBlock

        blob = self._blob(key)
        h = hashlib.sha256()
        size = 0
        staged: list[Any] = []
        buf = bytearray()
        # Block ids are unique to this write: a concurrent write of the same key stages its own.
        tag = uuid.uuid4().hex

        def stage(data: bytes) -> None:
            block_id = base64.b64encode(f"{tag}-{len(staged):08d}".encode()).decode()
            blob.stage_block(block_id, data, length=len(data))
            staged.append(BlobBlock(block_id=block_id))

        try:
            for block in bounded(blocks, limit_bytes):
                h.update(block)
                size += len(block)
                buf += block
                while len(buf) >= BLOCK_SIZE:
                    stage(bytes(buf[:BLOCK_SIZE]))
                    del buf[:BLOCK_SIZE]
            if not staged:  # small enough for one request
                blob.upload_blob(bytes(buf), overwrite=True, length=len(buf))
            else:
                if buf:
                    stage(bytes(buf))
                blob.commit_block_list(staged)
        except AzureError as exc:
            raise self._fail("write", key, exc) from None
        return Written(size=size, digest=f"sha256:{h.hexdigest()}")

    def get(self, key: str) -> Iterator[bytes]:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        try:
            downloader = self._blob(key).download_blob(max_concurrency=1)
        except ResourceNotFoundError:
            raise ObjectMissing(f"{key} is not in the artifact store (deleted by retention?)") from None
        except AzureError as exc:
            raise self._fail("read", key, exc) from None
        return iter(downloader.chunks())

    def delete(self, key: str) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        try:
            self._blob(key).delete_blob()
        except ResourceNotFoundError:
            return
        except AzureError as exc:
            raise self._fail("delete", key, exc) from None

    def exists(self, key: str) -> bool:
        return bool(self._blob(key).exists())

    def presigned_get(self, key: str, ttl_s: int) -> str | None:
        from azure.storage.blob import BlobSasPermissions, generate_blob_sas

        now = datetime.now(UTC)
        expiry = now + timedelta(seconds=ttl_s)
        blob = self._blob(key)
        signing: dict[str, Any] = {}
        account_key = getattr(self.service.credential, "account_key", None)
        try:
            if account_key:
                signing["account_key"] = account_key
            else:
                signing["user_delegation_key"] = self._delegation_key(now, expiry)
            sas = generate_blob_sas(
                account_name=self.service.account_name,
                container_name=self.container_name,
                blob_name=blob.blob_name,
                permission=BlobSasPermissions(read=True),
                start=now - timedelta(minutes=5),  # clock skew between the server and Azure
                expiry=expiry,
                **signing,
            )
        except Exception as exc:
            log.warning(
                "Azure container %s: cannot sign a SAS (%s); the server relays downloads", self.container_name, exc
            )
            return None
        return f"{blob.url}?{sas}"

    def _delegation_key(self, now: datetime, expiry: datetime) -> Any:
        """A user delegation key valid past `expiry`, fetched once a day at most."""
        if self._delegation is None or self._delegation[1] < expiry:
            until = max(expiry, now + timedelta(days=1))
            key = self.service.get_user_delegation_key(now - timedelta(minutes=5), until)
            self._delegation = (key, until)
        return self._delegation[0]

    def presigned_put(self, key: str, ttl_s: int) -> str | None:
        return None  # uploads are relayed: the server records and checks what is stored


def _short(exc: Exception) -> str:
    """The first line of an Azure error (its message carries the whole response after it)."""
    text = str(exc).strip()
    with contextlib.suppress(IndexError):
        text = text.splitlines()[0]
    return text[:300]
