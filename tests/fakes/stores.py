"""One artifact store of each kind for tests parametrized over stores: the local
directory, moto's S3, gcp-storage-emulator and Azurite, each server started once
per test module on 127.0.0.1 and a fresh bucket (container) per test.

Import the fixtures into a test module (`from tests.fakes.stores import ...`) and
parametrize with `STORES`; what each emulator cannot show is said in its module
(tests/fakes/gcs.py, tests/fakes/azurite.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from autoscaler.artifacts.store import ArtifactStore, LocalStore
from tests.fakes.azurite import AzuriteMissing, azure_store, azurite_server
from tests.fakes.gcs import gcs_emulator, gcs_store
from tests.fakes.s3 import moto_s3_server, s3_store

STORES = ["local", "s3", "gcs", "azure"]


@pytest.fixture(scope="module")
def moto_s3() -> Iterator[str]:
    with moto_s3_server() as url:
        yield url


@pytest.fixture(scope="module")
def gcs_url() -> Iterator[str]:
    with gcs_emulator() as url:
        yield url


@pytest.fixture(scope="module")
def azurite() -> Iterator[str]:
    try:
        with azurite_server() as connection_string:
            yield connection_string
    except AzuriteMissing as exc:
        pytest.skip(f"Azurite is not available: {exc}")


def open_test_store(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> ArtifactStore:
    if kind == "local":
        return LocalStore(tmp_path / "store")
    if kind == "s3":
        return s3_store(request.getfixturevalue("moto_s3"))
    if kind == "gcs":
        return gcs_store(request.getfixturevalue("gcs_url"))
    if kind == "azure":
        return azure_store(request.getfixturevalue("azurite"))
    raise ValueError(f"no test store {kind!r}")
