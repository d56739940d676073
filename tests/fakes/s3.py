"""moto's S3 in server mode on 127.0.0.1 (real boto3 over HTTP), and stores on it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

from autoscaler.artifacts.s3 import S3Store

CREDS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
_buckets = itertools.count(1)


@contextmanager
def moto_s3_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_store(url: str) -> S3Store:
    """A store on a fresh bucket of the moto server at `url`."""
    import boto3

    bucket = f"artifacts-{next(_buckets)}"
    boto3.client("s3", endpoint_url=url, **CREDS).create_bucket(Bucket=bucket)
    return S3Store(bucket, prefix="arts", endpoint_url=url, **CREDS)
