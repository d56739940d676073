"""Every shipped test case, through the real engine; and the shipped policies pass check."""

from __future__ import annotations

import pytest

from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import check, check_and_test, complete_input, mismatches, run_case
from autoscaler.policy.engines import EmbeddedEngine
from tests.policy.helpers import DEMO_DATA

BUNDLE = load_bundle(shipped_policy_dir(), data_dir=DEMO_DATA)


@pytest.fixture(scope="module")
def engine():
    eng = EmbeddedEngine(BUNDLE, isolate=False)
    assert eng.compile() == []
    yield eng
    eng.close()


def test_the_shipped_policies_have_at_least_30_cases():
    assert len(BUNDLE.cases) >= 30
    assert {c.file for c in BUNDLE.cases} == {
        "tests/budgets.yaml",
        "tests/priorities.yaml",
        "tests/placement.yaml",
    }


def test_the_shipped_policies_pass_the_leniency_checks(engine):
    assert check(BUNDLE, engine) == []


@pytest.mark.parametrize("case", BUNDLE.cases, ids=[f"{c.file}:{c.name}" for c in BUNDLE.cases])
def test_case(engine, case):
    result = run_case(engine, case)
    assert result.passed, result.failures


def test_a_wrong_expectation_fails(engine):
    # The runner must be able to fail: flip one expected value of a real case.
    case = next(c for c in BUNDLE.cases if "hard budget spent" in c.name)
    wrong = type(case)(
        name=case.name, file=case.file, input=case.input, expect={"teams": {"research": {"drain": False}}}
    )
    result = run_case(engine, wrong)
    assert result.failures == ["decision.teams.research.drain: expected False, got True"]


def test_isolated_engine_gives_the_same_decisions():
    # The child-process engine answers exactly as the in-process one does.
    isolated = EmbeddedEngine(BUNDLE, isolate=True, timeout_s=10)
    try:
        report = check_and_test(BUNDLE, isolated)
        assert report.ok, report.summary()
        assert len(report.results) == len(BUNDLE.cases)
    finally:
        isolated.close()


def test_evaluation_result_carries_revision_digest_and_time(engine):
    policy_input = complete_input({"now": "2026-03-16T00:00:00Z", "teams": [{"name": "research"}]})
    first = engine.evaluate(policy_input)
    second = engine.evaluate(policy_input)
    assert first.error is None and not first.decision.fail_safe
    assert first.revision == BUNDLE.revision and len(first.revision) == 16
    assert first.input_digest == second.input_digest
    assert first.eval_ms > 0
    other = engine.evaluate(complete_input({"now": "2026-03-16T00:00:00Z", "teams": [{"name": "interns"}]}))
    assert other.input_digest != first.input_digest


def test_billing_period_is_the_utc_calendar_month():
    p = complete_input({"now": "2026-12-31T23:00:00+00:00"})
    assert p.billing_period_start.isoformat() == "2026-12-01T00:00:00+00:00"
    assert p.billing_period_end.isoformat() == "2027-01-01T00:00:00+00:00"
    assert p.hours_left_in_period == pytest.approx(1.0)


def test_mismatch_messages_name_the_path():
    assert mismatches({"a": {"b": [1, 2]}}, {"a": {"b": [1, 3]}}) == ["decision.a.b[1]: expected 2, got 3"]
    assert mismatches({"x": True}, {"x": 1}) == ["decision.x: expected True, got 1"]
    assert mismatches({"x": 0.1 + 0.2}, {"x": 0.3}) == []
