"""Azurite's Blob service on 127.0.0.1 (real azure-storage-blob over HTTP), and stores on it.

Azurite is installed by scripts/ensure-azurite.sh (npm). Each server gets a temp
directory and an account with a random key made here (AZURITE_ACCOUNTS), so no
well-known emulator key is used. Azurite checks shared-key signatures and SAS tokens
(signature, permissions, expiry) as Azure does; it has no Entra ID, so the user
delegation SAS path of the store is not exercised by these tests.
"""

from __future__ import annotations

import base64
import itertools
import os
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from autoscaler.artifacts.azure_blob import AzureBlobStore

REPO = Path(__file__).resolve().parents[2]
ENSURE = REPO / "scripts" / "ensure-azurite.sh"
ACCOUNT = "autoscalertest"
_containers = itertools.count(1)


class AzuriteMissing(Exception):
    """scripts/ensure-azurite.sh could not install Azurite (the message says why)."""


def azurite_binary() -> Path:
    try:
        proc = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise AzuriteMissing("scripts/ensure-azurite.sh did not finish in 10 min") from None
    if proc.returncode != 0:
        raise AzuriteMissing(f"scripts/ensure-azurite.sh failed: {proc.stderr[-800:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def azurite_server() -> Iterator[str]:
    """An Azurite blob server; yields its connection string."""
    binary = azurite_binary()
    key = base64.b64encode(secrets.token_bytes(64)).decode()
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="azurite-") as tmp:
        env = {**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"}
        log = open(Path(tmp) / "azurite.log", "wb")  # noqa: SIM115 - closed below, after the process
        proc = subprocess.Popen(
            # --skipApiVersionCheck: the SDK may be newer than the Azurite release it talks to.
            [
                str(binary),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(port),
                "--location",
                tmp,
                "--silent",
                "--skipApiVersionCheck",
                "--disableProductStyleUrl",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        endpoint = f"http://127.0.0.1:{port}/{ACCOUNT}"
        try:
            deadline = time.monotonic() + 30
            while True:
                if proc.poll() is not None:
                    raise AzuriteMissing(
                        f"azurite exited ({proc.returncode}): {(Path(tmp) / 'azurite.log').read_text()[-800:]}"
                    )
                try:
                    httpx.get(f"{endpoint}?comp=list", timeout=1)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise AzuriteMissing("azurite did not answer within 30 s") from None
                    time.sleep(0.2)
            yield f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};BlobEndpoint={endpoint};"
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            log.close()


def azure_store(connection_string: str) -> AzureBlobStore:
    """A store on a fresh container of the Azurite server."""
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(connection_string, retry_total=2)
    container = f"artifacts-{next(_containers)}"
    service.create_container(container)
    return AzureBlobStore(container, prefix="arts", service=service)
