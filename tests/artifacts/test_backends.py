"""Opening the store the config names: each cloud store from its config keys, and every
mistake a config error that says what to set (no traceback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.artifacts.azure_blob import AzureBlobStore
from autoscaler.artifacts.backends import open_store
from autoscaler.artifacts.gcs import GCSStore
from autoscaler.artifacts.store import LocalStore
from autoscaler.config import AutoscalerConfig
from autoscaler.errors import ConfigError
from tests.fakes.stores import azurite, gcs_url  # noqa: F401 - fixtures


def config(**artifacts: object) -> AutoscalerConfig:
    return AutoscalerConfig.model_validate({"artifacts": artifacts})


def test_the_default_is_a_local_directory_under_home(tmp_path: Path) -> None:
    store = open_store(config(), tmp_path)
    assert isinstance(store, LocalStore) and store.root == (tmp_path / "artifacts").resolve()


@pytest.mark.parametrize("kind,what", [("s3", "bucket"), ("gcs", "bucket"), ("azure", "container")])
def test_a_cloud_store_without_a_bucket_says_so(tmp_path: Path, kind: str, what: str) -> None:
    with pytest.raises(ConfigError, match=f"artifacts.bucket is not set: name the {what}"):
        open_store(config(store=kind), tmp_path)


def test_azure_without_an_account_says_what_to_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    with pytest.raises(ConfigError, match="AZURE_STORAGE_CONNECTION_STRING"):
        open_store(config(store="azure", bucket="arts"), tmp_path)


def test_azure_takes_its_key_from_the_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", request.getfixturevalue("azurite"))
    store = open_store(config(store="azure", bucket="opened", prefix="p"), tmp_path)
    assert isinstance(store, AzureBlobStore)
    store.service.create_container("opened")
    store.put("k", [b"v"])
    assert b"".join(store.get("k")) == b"v" and store.container.get_blob_client("p/k").exists()


def test_gcs_opens_on_the_named_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue("gcs_url")
    # Anonymous on the emulator: google-auth finds no credentials here, and must not look for long.
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "autoscaler-test")
    from google.auth.credentials import AnonymousCredentials

    monkeypatch.setattr("google.auth.default", lambda *a, **k: (AnonymousCredentials(), "autoscaler-test"))
    store = open_store(config(store="gcs", bucket="opened", endpoint_url=url), tmp_path)
    assert isinstance(store, GCSStore)
    store.client.create_bucket("opened")
    store.put("k", [b"v"])
    assert b"".join(store.get("k")) == b"v"
