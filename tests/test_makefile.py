"""`make run` installs what the embedded loop needs; `make test` everything (checked
with `make -n`, which prints the commands without running them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _plan(target: str, venv: Path) -> str:
    r = subprocess.run(
        ["make", "-n", "-C", str(REPO), target, f"VENV={venv}"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _installs(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if " install " in line and "-e " in line]


def test_make_run_installs_only_the_loop_and_make_test_upgrades_that_venv(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # the venv exists: only the installs are planned
    (run_install,) = _installs(_plan("run", venv))
    assert "dev" not in run_install and "aws" not in run_install
    # A venv made by `make run` (its stamp is there) still gets the full install for tests.
    (venv / ".installed-run").touch()
    assert _installs(_plan("run", venv)) == []
    (test_install,) = _installs(_plan("test", venv))
    assert "dev" in test_install and "aws" in test_install
    # ...and the full install also satisfies `make run`.
    (venv / ".installed-all").touch()
    assert _installs(_plan("run", venv)) == []
