"""The shipped Prometheus rules (deploy/prometheus/): `promtool check rules` accepts them,
`promtool test rules` passes their unit tests, and every metric they read is one a
live `/metrics` scrape exposes (a renamed metric would silence an alert without this).
promtool comes from Debian's `prometheus` package (scripts/ensure-prometheus.sh)."""

from __future__ import annotations

import re
import subprocess
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.state.db import transaction
from autoscaler.state.models import DecisionRecord, Instance, InstanceEvent
from tests.conftest import LiveServer
from tests.deploy.conftest import REPO, require_tool
from tests.web.helpers import add_instance, add_spend

RULES_DIR = REPO / "deploy" / "prometheus"
RULES = RULES_DIR / "autoscaler-rules.yml"
TESTS = sorted((RULES_DIR / "tests").glob("*.test.yml"))
HOW = "run scripts/ensure-prometheus.sh (make test does)"


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_tool("promtool", HOW), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def _rules() -> list[dict[str, object]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules_accepts_the_shipped_rules() -> None:
    proc = _promtool("check", "rules", str(RULES))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in proc.stdout


def test_promtool_test_rules_passes() -> None:
    assert TESTS, "no unit tests under deploy/prometheus/tests"
    for test in TESTS:
        proc = _promtool("test", "rules", test.name, cwd=test.parent)
        assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


def test_every_alert_is_unit_tested_and_labelled() -> None:
    tested = set()
    for test in TESTS:
        for case in yaml.safe_load(test.read_text())["tests"]:
            for alert in case.get("alert_rule_test", []):
                if alert.get("exp_alerts"):
                    tested.add(alert["alertname"])
    alerts = [r for r in _rules() if "alert" in r]
    assert {a["alert"] for a in alerts} == tested, "each alert needs a firing case in deploy/prometheus/tests"
    for a in alerts:
        labels, notes = a.get("labels") or {}, a.get("annotations") or {}
        assert isinstance(labels, dict) and labels.get("severity") in ("info", "warning", "critical"), a
        assert isinstance(notes, dict) and notes.get("summary") and notes.get("description"), a
    records = [r for r in _rules() if "record" in r]
    assert any(str(r["record"]).startswith("team:autoscaler_spend_usd_per_hour") for r in records)


def test_rules_read_only_metrics_that_metrics_exposes(live_server: LiveServer, admin_token: str) -> None:
    ctx = live_server.ctx
    now = ctx.clock.now()
    inst = add_instance(ctx, team="vision", now=now, state="booting", price=0.4)
    add_spend(ctx, team="vision", start=now - timedelta(hours=2), hours=1, price=0.4)
    with transaction(ctx.sessions) as s:
        row = s.get(Instance, inst)
        assert row is not None
        row.launched_at = now - timedelta(minutes=12)
        s.add(InstanceEvent(instance_id=inst, at=now, from_state="launching", to_state="booting", reason="t"))
        s.add(DecisionRecord(at=now, error="the policy service is down"))
    response = httpx.get(f"{live_server.url}/metrics", headers={"Authorization": f"Bearer {admin_token}"}, timeout=10)
    assert response.status_code == 200, response.text
    exposed: set[str] = set()
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(response.text):
        exposed.add(family.name + ("_total" if family.type == "counter" else ""))
        for sample in family.samples:
            exposed.add(sample.name)
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    # The exposition passes promtool's own lint too.
    lint = subprocess.run(
        [require_tool("promtool", HOW), "check", "metrics"],
        input=response.text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    # Metric names in the expressions; recorded series (`level:metric:operation`) skipped.
    used = {name for rule in _rules() for name in re.findall(r"(?<![:\w])autoscaler_\w+", str(rule["expr"]))}
    missing = sorted(used - exposed)
    assert not missing, f"rules read metrics that /metrics does not expose: {missing}"
    assert samples[("autoscaler_instance_transitions_total", (("pool", "gpu-pool"), ("state", "booting")))] == 1
    assert samples[("autoscaler_instance_oldest_booting_seconds", (("pool", "gpu-pool"),))] == pytest.approx(
        720, abs=60
    )
    assert samples[("autoscaler_policy_fail_safe", ())] == 1
