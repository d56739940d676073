"""gcp-storage-emulator on 127.0.0.1 (real google-cloud-storage over HTTP), and stores on it.

What the emulator does not do, and so what these tests cannot show: it checks no
credential and no signature. Signed URLs are made here by the real V4 signer with a
throwaway service-account key (generated per session, never stored), and the
emulator serves them, but an expired or forged URL would be served too; the tests
check the URL's form (one object, GET, the expiry asked for) instead.
"""

from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

from autoscaler.artifacts.gcs import GCSStore

PROJECT = "autoscaler-test"
_buckets = itertools.count(1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def gcs_emulator() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    port = _free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@cache
def signing_credentials() -> Any:
    """A service-account credential with a fresh RSA key: signs, reaches nothing."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from google.oauth2 import service_account

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    info = {
        "type": "service_account",
        "project_id": PROJECT,
        "private_key_id": "test",
        "private_key": pem,
        "client_email": f"artifacts@{PROJECT}.iam.gserviceaccount.com",
        "token_uri": "http://127.0.0.1:9/token",  # never called: signing is local
    }
    return service_account.Credentials.from_service_account_info(info)


def gcs_store(url: str) -> GCSStore:
    """A store on a fresh bucket of the emulator at `url`."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project=PROJECT, credentials=AnonymousCredentials(), client_options={"api_endpoint": url})
    bucket = f"artifacts-{next(_buckets)}"
    client.create_bucket(bucket)
    return GCSStore(
        bucket, prefix="arts", client=client, signing_endpoint=url, signing_credentials=signing_credentials()
    )
