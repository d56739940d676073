"""Broken policies give a clear file:line message and never replace the good one."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from autoscaler.clock import ManualClock
from autoscaler.config import PolicyConfig
from autoscaler.policy.bundle import load_bundle
from autoscaler.policy.cases import check, complete_input
from autoscaler.policy.engines import EmbeddedEngine
from autoscaler.policy.interpreters import INTERPRETERS
from autoscaler.policy.problems import PolicyError
from autoscaler.policy.service import PolicyService
from tests.policy.helpers import NOW, copy_policies, write_module

HEADER = "package autoscaler.extra\n\nimport rego.v1\n\n"

BAD = {
    "syntax error": (HEADER + 'x := {"a": 1\n', "extra.rego:5", "unclosed"),
    "unknown function": (
        HEADER + "x := budgetz.total(1)\n",
        "extra.rego:5",
        "unknown function budgetz.total()",
    ),
    "rule without if": (HEADER + "x := 1 { input.now }\n", "extra.rego:5", "rule body without `if`"),
    "partial set without contains": (HEADER + 'd[m] if { m := "x" }\n', "extra.rego:5", "needs `contains`"),
    "typo in an input field": (
        HEADER + "hot contains t.name if {\n\tsome t in input.teams\n\tt.burn_rate_usd > 10\n}\n",
        "extra.rego:7",
        "has no field `burn_rate_usd`",
    ),
    "typo in a top-level input field": (
        HEADER + "late if input.hours_left_in_perod < 24\n",
        "extra.rego:5",
        "input has no field `hours_left_in_perod`",
    ),
    "max compares text": (HEADER + "m := max([80, 100])\n", "extra.rego:5", "compares numbers as text"),
    "fixed-point format rounds ties apart": (
        HEADER + '# sprintf("%.0f") in a comment is fine\nm := sprintf("%.0f%%", [102.5])\n',
        "extra.rego:6",
        "sprintf format %.0f rounds a tie differently",
    ),
    "missing import rego.v1": (
        "package autoscaler.extra\n\nx := 1\n",
        "extra.rego:1",
        "add `import rego.v1`",
    ),
    "unknown data file": (
        HEADER + "x := data.budgetz.teams\n",
        "extra.rego:5",
        "data.budgetz does not exist",
    ),
}


# Where regorus itself refuses the file (at parse time, before the lint runs), its own
# message is what the author sees; every other check is the lint's, the same for both.
REGORUS_SAYS = {
    "syntax error": ("extra.rego:6", "expecting `}` while parsing object"),
    "rule without if": ("extra.rego:5", "`if` keyword is required before rule body"),
}


def expected(name: str, interpreter: str) -> tuple[str, str]:
    """(file:line, words) the author must see for BAD[name] under that interpreter."""
    _, where, reason = BAD[name]
    return REGORUS_SAYS.get(name, (where, reason)) if interpreter == "regorus" else (where, reason)


@pytest.mark.parametrize("interpreter", INTERPRETERS)
@pytest.mark.parametrize("name", list(BAD))
def test_check_reports_file_line_and_reason(tmp_path, name, interpreter):
    source = BAD[name][0]
    where, reason = expected(name, interpreter)
    directory = copy_policies(tmp_path)
    write_module(directory, "extra.rego", source)
    bundle = load_bundle(directory)
    engine = EmbeddedEngine(bundle, isolate=False, interpreter=interpreter)
    problems = [str(p) for p in check(bundle, engine)]
    assert any(p.startswith(where) and reason in p for p in problems), problems


CONFLICT_SAYS = {
    # rego-cpp gives no text for a conflict; the runtime evaluates each rule alone to name it.
    "rego-cpp": "extra.rego:5: rule autoscaler.extra.level failed",
    "regorus": "extra.rego:6:1: rule conflicts with rule at extra.rego:5:1",
}


@pytest.mark.parametrize("interpreter", INTERPRETERS)
def test_conflicting_complete_rules_are_named_with_file_and_line(tmp_path, interpreter):
    directory = copy_policies(tmp_path)
    # Both bodies hold for a team with spend, so `level` has two values.
    write_module(
        directory,
        "extra.rego",
        HEADER + ('level := "low" if count(input.teams) > 0\nlevel := "high" if count(input.teams) > 0\n'),
    )
    (directory / "decision.rego").write_text(
        (directory / "decision.rego")
        .read_text()
        .replace('"schema_version": "1",', '"schema_version": "1",\n\t"warn": [data.autoscaler.extra.level],', 1)
        .replace('\t"warn": sort([m | some m in warnings]),\n', "")
    )
    bundle = load_bundle(directory, with_cases=False)
    engine = EmbeddedEngine(bundle, isolate=False, interpreter=interpreter)
    assert engine.compile() == []
    result = engine.evaluate(complete_input({"now": NOW, "teams": [{"name": "research"}]}))
    assert result.decision.fail_safe
    assert CONFLICT_SAYS[interpreter] in result.error
    assert result.decision.team("research").may_scale_up is False


def test_a_typo_in_the_decision_shape_fails_safe(tmp_path):
    directory = copy_policies(tmp_path)
    source = (directory / "decision.rego").read_text().replace('"may_scale_up":', '"may_scaleup":')
    (directory / "decision.rego").write_text(source)
    engine = EmbeddedEngine(load_bundle(directory, with_cases=False), isolate=False)
    engine.compile()
    result = engine.evaluate(complete_input({"now": NOW, "teams": [{"name": "research"}]}))
    assert result.decision.fail_safe
    assert "teams.research.may_scaleup" in result.error
    assert result.decision.team("anyone").may_scale_up is False


def _service(directory, clock):
    return PolicyService(PolicyConfig(dir=str(directory), timeout_s=10), clock=clock, isolate=True)


@pytest.mark.parametrize("name", ["syntax error", "unknown function", "typo in an input field"])
def test_reload_keeps_the_last_good_policy(tmp_path, name):
    directory = copy_policies(tmp_path)
    clock = ManualClock(datetime(2026, 3, 16, tzinfo=UTC))
    service = _service(directory, clock)
    try:
        good = service.revision
        write_module(directory, "extra.rego", BAD[name][0])
        outcome = service.reload()
        assert not outcome.ok
        assert outcome.revision == good and outcome.candidate != good
        where, reason = expected(name, service.config.interpreter)
        assert reason in outcome.message and where in outcome.message
        status = service.status()
        assert status["revision"] == good and status["last_reload_error"] == outcome.message
        # The good policy still decides.
        result = service.evaluate(complete_input({"now": NOW, "teams": [{"name": "research"}]}))
        assert result.error is None and result.revision == good
    finally:
        service.close()


def test_reload_refuses_a_policy_that_fails_its_own_test_cases(tmp_path):
    directory = copy_policies(tmp_path)
    service = _service(directory, ManualClock())
    try:
        good = service.revision
        # The cases run on their fixture data (tests/fixtures): a budget changed there
        # makes the budget cases fail.
        budgets = directory / "tests" / "fixtures" / "budgets.yaml"
        budgets.write_text(budgets.read_text().replace("monthly_usd: 20000", "monthly_usd: 25000"))
        outcome = service.reload()
        assert not outcome.ok and service.revision == good
        assert "test case(s) failed" in outcome.message and "tests/budgets.yaml" in outcome.message
    finally:
        service.close()


def test_reload_refuses_bad_yaml_data_with_line(tmp_path):
    directory = copy_policies(tmp_path)
    service = _service(directory, ManualClock())
    try:
        (directory / "data" / "budgets.yaml").write_text("teams:\n  research: {monthly_usd: 1\n")
        outcome = service.reload()
        assert not outcome.ok
        assert "data/budgets.yaml:3" in outcome.message
    finally:
        service.close()


def test_a_good_change_is_swapped_in_by_the_file_watch(tmp_path):
    directory = copy_policies(tmp_path)
    service = _service(directory, ManualClock())
    try:
        good = service.revision
        assert service.check_for_changes() is None  # nothing changed
        budgets = directory / "data" / "budgets.yaml"
        budgets.write_text(budgets.read_text() + "  vision:\n    monthly_usd: 384\n    kind: hard\n")
        outcome = service.check_for_changes()
        assert outcome is not None and outcome.ok, outcome
        assert service.revision != good
        result = service.evaluate(complete_input({"now": NOW, "teams": [{"name": "vision"}]}))
        assert result.decision.team("vision").spend_headroom_per_hour == pytest.approx(1.0)
        assert result.revision == service.revision
    finally:
        service.close()


def test_a_broken_policy_at_start_is_refused_with_a_clear_error(tmp_path):
    directory = copy_policies(tmp_path)
    write_module(directory, "extra.rego", BAD["syntax error"][0])
    with pytest.raises(PolicyError, match=r"cannot be put in force: .*extra.rego:6:1: expecting `}` while parsing"):
        PolicyService(PolicyConfig(dir=str(directory)), isolate=False)
    with pytest.raises(PolicyError, match=r"cannot be put in force: .*extra.rego:5:\d+: this is unclosed"):
        PolicyService(PolicyConfig(dir=str(directory), interpreter="rego-cpp"), isolate=False)


@pytest.mark.parametrize("interpreter", INTERPRETERS)
def test_an_undefined_decision_fails_safe_and_says_so(tmp_path, interpreter):
    (tmp_path / "decision.rego").write_text(
        'package autoscaler\n\nimport rego.v1\n\ndecision := {"warn": []} if input.fleet.never == 1\n'
    )
    engine = EmbeddedEngine(load_bundle(tmp_path, with_cases=False), isolate=False, interpreter=interpreter)
    try:
        assert engine.compile() == []
        result = engine.evaluate(complete_input({"now": NOW, "teams": [{"name": "research"}]}))
        assert result.decision.fail_safe
        assert "the policy's decision is undefined" in (result.error or "")
    finally:
        engine.close()


def test_a_bundle_without_the_decision_package_is_refused_by_regorus(tmp_path):
    (tmp_path / "other.rego").write_text("package other\n\nimport rego.v1\n\nx := 1\n")
    engine = EmbeddedEngine(load_bundle(tmp_path, with_cases=False), isolate=False, interpreter="regorus")
    try:
        (problem,) = engine.compile()
        assert "no module declares package autoscaler" in str(problem)
    finally:
        engine.close()
