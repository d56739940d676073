"""checkov over every Terraform module and example and both Dockerfiles, offline.

Every finding is fixed or skipped inline with `#checkov:skip=ID:reason`, so any new
failure here is a real regression. checkov lives in .venv-checkov (scripts/ensure-checkov.sh)
and runs once, beside the terraform jobs (conftest.py `background`), with --quiet: the
report lists failures only, and each framework's summary keeps the counts.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.deploy.conftest import AGENT_IMAGE, CHECKOV_ARGS, REPO, TERRAFORM, Background

# An inline skip: `#checkov:skip=CKV_AWS_1:why`; the reason after the second colon.
_SKIP = re.compile(r"#\s*checkov:skip=([A-Z0-9_]+)(?::(.*))?")


def _documents(text: str) -> list[dict[str, Any]]:
    """checkov may print several JSON documents (an object per framework, or a list)."""
    decoder, i, out = json.JSONDecoder(), 0, []
    while i < len(text):
        if text[i].isspace():
            i += 1
            continue
        doc, i = decoder.raw_decode(text, i)
        out.extend(doc if isinstance(doc, list) else [doc])
    if not out:
        pytest.fail(f"checkov printed no report: {text[-500:]}", pytrace=False)
    return out


def test_checkov_finds_nothing_unjustified(background: Background) -> None:
    (res,) = background.result("checkov")
    reports = {r["check_type"]: r for r in _documents(res.stdout)}.values()
    assert {r["check_type"] for r in reports} == {"terraform", "dockerfile"}, res.stderr[-2000:]
    unparsed = {r["check_type"]: r["summary"]["parsing_errors"] for r in reports if r["summary"]["parsing_errors"]}
    assert not unparsed, f"checkov could not parse some files {unparsed}; stderr: {res.stderr[-2000:]}"
    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range'][0]})"
        for r in reports
        for c in r["results"]["failed_checks"]
    ]
    assert not failed, "checkov findings (fix them or justify with #checkov:skip=ID:reason):\n" + "\n".join(failed)
    assert res.returncode == 0, res.stderr[-2000:]
    summary = {r["check_type"]: r["summary"] for r in reports}
    # It really scanned the modules and the Dockerfiles, and honoured the inline skips.
    assert summary["terraform"]["passed"] > 100 and summary["dockerfile"]["passed"] > 10, summary
    assert summary["terraform"]["skipped"] > 0, summary


def test_every_inline_skip_gives_a_reason() -> None:
    # --quiet leaves skipped checks out of the report, so the reasons are read where
    # they are written; the scan above covers exactly these directories.
    assert "-d" in CHECKOV_ARGS and "terraform" in CHECKOV_ARGS
    files = [*TERRAFORM.rglob("*.tf"), *(AGENT_IMAGE / "docker").glob("*Dockerfile*")]
    skips = [
        (f.relative_to(REPO), m) for f in files if ".terraform" not in f.parts for m in _SKIP.finditer(f.read_text())
    ]
    assert skips, "no inline skip found: is the pattern still right?"
    unexplained = [f"{path}: {m.group(0)}" for path, m in skips if not (m.group(2) or "").strip()]
    assert not unexplained, "every skip needs a reason (#checkov:skip=ID:reason):\n" + "\n".join(unexplained)
