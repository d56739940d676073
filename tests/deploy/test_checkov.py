"""checkov over every Terraform module and example and both Dockerfiles, offline.

Every finding is fixed or skipped inline with `#checkov:skip=ID:reason`, so any new
failure here is a real regression. checkov lives in .venv-checkov (scripts/ensure-checkov.sh).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.deploy.conftest import CHECKOV, REPO, run


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


def test_checkov_finds_nothing_unjustified() -> None:
    if not CHECKOV.exists():
        pytest.fail("checkov is not installed: run scripts/ensure-checkov.sh", pytrace=False)
    # terraform test files (*.tftest.hcl) are not configuration; checkov cannot parse them.
    res = run([str(CHECKOV), "--skip-download", "--compact", "-o", "json",
               "--framework", "terraform", "dockerfile", "--skip-path", "/tests/",
               "-d", "terraform", "-d", "agent_image/docker"], cwd=REPO, timeout=600)
    reports = {r["check_type"]: r for r in _documents(res.stdout)}.values()
    errors = [e for r in reports for e in r["results"].get("parsing_errors", [])]
    assert not errors, f"checkov could not parse {errors}; stderr: {res.stderr[-2000:]}"
    failed = [f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range'][0]})"
              for r in reports for c in r["results"]["failed_checks"]]
    passed = sum(len(r["results"]["passed_checks"]) for r in reports)
    assert not failed, "checkov findings (fix them or justify with #checkov:skip=ID:reason):\n" + "\n".join(failed)
    assert {r["check_type"] for r in reports} == {"terraform", "dockerfile"}
    assert passed > 100  # it really scanned the modules and Dockerfiles
    skipped = [c for r in reports for c in r["results"]["skipped_checks"]]
    assert skipped and all(c["check_result"].get("suppress_comment") for c in skipped), "every skip needs a reason"
