"""The Dockerfiles, without a Docker daemon (none runs here): what they copy exists in
the build context (the repository root) and what they run is a real CLI command.
checkov scans them too (test_checkov.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.deploy.conftest import AGENT_IMAGE, REPO

DOCKERFILES = sorted((AGENT_IMAGE / "docker").glob("*.Dockerfile"))


def test_both_images_exist() -> None:
    assert [p.name for p in DOCKERFILES] == ["agent.Dockerfile", "control-plane.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_copied_sources_exist(path: object) -> None:
    text = path.read_text()  # type: ignore[attr-defined]
    for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M):
        *sources, _dest = line.split()
        for src in sources:
            assert (REPO / src).exists(), f"{path}: COPY {src} is missing from the build context"


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_non_root_and_calls_a_real_command(path: object) -> None:
    text = path.read_text()  # type: ignore[attr-defined]
    assert re.search(r"^USER (?!root)\S+", text, re.M)
    entry = json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    cmd = json.loads(re.search(r"^CMD (.+)$", text, re.M).group(1))  # type: ignore[union-attr]
    argv = entry + cmd
    assert argv[0] == "autoscaler"
    sub = argv[1]
    res = subprocess.run(
        [sys.executable, "-m", "autoscaler", sub, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        # Wide enough that no option name is cut to fit (rich ends a cut one with "…").
        env={**os.environ, "COLUMNS": "200"},
    )
    assert res.returncode == 0, res.stderr
    for flag in (a for a in argv[2:] if a.startswith("--")):
        assert flag in res.stdout, f"`autoscaler {sub}` has no {flag}"
