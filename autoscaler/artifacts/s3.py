"""The artifact store on S3 (or anything speaking its API), with boto3.

Writes stream as a multipart upload (8 MiB parts, so nothing larger is held in
memory), completed only at the end: a failed or oversized write is aborted and the
old object stays. boto3's own retries (standard mode, 5 attempts) cover each call.
Downloads by workers go straight to S3 on a presigned GET; uploads are relayed by the
server (which records and checks them), so no worker ever holds an S3 credential.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Iterator
from typing import Any

from autoscaler.artifacts.store import BLOCK, ObjectMissing, StoreError, Written, bounded

PART = 8 * 1024 * 1024  # S3's minimum part is 5 MiB (the last part may be smaller)


class S3Store:
    name = "s3"

    def __init__(self, bucket: str, *, prefix: str = "", client: Any = None, **client_kw: Any) -> None:
        if client is None:
            import boto3
            from botocore.config import Config

            client = boto3.client("s3", config=Config(retries={"mode": "standard", "max_attempts": 5}), **client_kw)
        self.s3 = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""

    def _key(self, key: str) -> str:
        return self.prefix + key

    def _fail(self, what: str, key: str, exc: Exception) -> StoreError:
        return StoreError(f"S3 bucket {self.bucket}: cannot {what} {key}: {exc}")

    def put(self, key: str, blocks: Iterable[bytes], *, limit_bytes: int | None = None) -> Written:
        from botocore.exceptions import BotoCoreError, ClientError

        k = self._key(key)
        h = hashlib.sha256()
        size = 0
        upload_id: str | None = None
        parts: list[dict[str, Any]] = []
        buf = bytearray()
        try:
            for block in bounded(blocks, limit_bytes):
                h.update(block)
                size += len(block)
                buf += block
                while len(buf) >= PART:
                    if upload_id is None:
                        upload_id = self.s3.create_multipart_upload(Bucket=self.bucket, Key=k)["UploadId"]
                    n = len(parts) + 1
                    r = self.s3.upload_part(
                        Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=n, Body=bytes(buf[:PART])
                    )
                    parts.append({"ETag": r["ETag"], "PartNumber": n})
                    del buf[:PART]
            if upload_id is None:  # small enough for one request
                self.s3.put_object(Bucket=self.bucket, Key=k, Body=bytes(buf))
            else:
                if buf:
                    n = len(parts) + 1
                    r = self.s3.upload_part(
                        Bucket=self.bucket, Key=k, UploadId=upload_id, PartNumber=n, Body=bytes(buf)
                    )
                    parts.append({"ETag": r["ETag"], "PartNumber": n})
                self.s3.complete_multipart_upload(
                    Bucket=self.bucket, Key=k, UploadId=upload_id, MultipartUpload={"Parts": parts}
                )
        except BaseException as exc:
            if upload_id is not None:
                # If this fails too, the bucket's lifecycle rule for incomplete uploads cleans up.
                with contextlib.suppress(BotoCoreError, ClientError):
                    self.s3.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
            if isinstance(exc, BotoCoreError | ClientError):
                raise self._fail("write", key, exc) from None
            raise
        return Written(size=size, digest=f"sha256:{h.hexdigest()}")

    def get(self, key: str) -> Iterator[bytes]:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            body = self.s3.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ObjectMissing(f"{key} is not in the artifact store (deleted by retention?)") from None
            raise self._fail("read", key, exc) from None
        except BotoCoreError as exc:
            raise self._fail("read", key, exc) from None
        return _chunks(body)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.s3.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (BotoCoreError, ClientError) as exc:
            raise self._fail("delete", key, exc) from None

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self.s3.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError:
            return False
        return True

    def presigned_get(self, key: str, ttl_s: int) -> str | None:
        url: str = self.s3.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self._key(key)}, ExpiresIn=ttl_s
        )
        return url

    def presigned_put(self, key: str, ttl_s: int) -> str | None:
        return None  # uploads are relayed: the server records and checks what is stored


def _chunks(body: Any) -> Iterator[bytes]:
    try:
        yield from body.iter_chunks(BLOCK)
    finally:
        body.close()
