"""Dashboard fixtures: one headless Debian Chromium for the whole session (driven by
playwright through `executable_path`), a config whose policy data holds budgets, and
the directory screenshots are saved to (env AUTOSCALER_ARTIFACTS)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from autoscaler.config import AutoscalerConfig
from tests.web.helpers import budget_config

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
BUDGETS = {"vision": 100.0, "nlp": 1000.0}


@pytest.fixture
def config(tmp_path: Path) -> AutoscalerConfig:
    return budget_config(tmp_path / "policies", BUDGETS)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = (
        Path(os.environ["AUTOSCALER_ARTIFACTS"])
        if os.environ.get("AUTOSCALER_ARTIFACTS")
        else (tmp_path_factory.mktemp("artifacts"))
    )
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:  # a missing browser is a harness failure, never a skip
        pytest.fail("Debian's chromium is not installed: run `make test` or scripts/ensure-chromium.sh")
    with sync_playwright() as p:
        # playwright gives each launch a fresh temporary profile (user-data-dir).
        chromium = p.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, headless=True)
        yield chromium
        chromium.close()
