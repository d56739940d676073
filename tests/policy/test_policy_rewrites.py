"""The shipped policies decide what they decided before they were rewritten for speed.

`oracle_policies/` holds `decision.rego`, `budgets.rego` and `priorities.rego` as they
were before issue 20's third policy pass (per-team settings resolved once in
`priorities.team_settings`, budget entries bound before the loop over teams). The
oracle bundle is the shipped one with those three files swapped back in; both run on
regorus, on the demo data the shipped cases use and on the shipped data (no team
configured), and must give one decision: every shipped case, generated inputs (the
differential test's strategy), and the bench's large input (100 teams).

When a later change to the shipped policies is meant to change a decision, update the
oracle files with it (or drop the file the change no longer matches).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given

from autoscaler.policy.bundle import PolicyBundle, load_bundle, shipped_policy_dir
from autoscaler.policy.cases import complete_input
from autoscaler.policy.engines import EmbeddedEngine, to_decision
from bench.policy_eval import big_input
from tests.policy.helpers import DEMO_DATA, NOW
from tests.policy.test_engine_differential import DIFFERENTIAL, differences, policy_inputs

ORACLE = Path(__file__).parent / "oracle_policies"
DATA_DIRS = {"demo data": DEMO_DATA, "shipped data": None}


def oracle_of(bundle: PolicyBundle) -> PolicyBundle:
    modules = dict(bundle.modules)
    for path in sorted(ORACLE.glob("*.rego")):
        assert path.name in modules, f"{path.name} is not a shipped module"
        modules[path.name] = path.read_text()
    return PolicyBundle(bundle.directory, modules, bundle.data, "oracle")


@pytest.fixture(scope="module", params=sorted(DATA_DIRS))
def pair(request: pytest.FixtureRequest) -> Any:
    bundle = load_bundle(shipped_policy_dir(), data_dir=DATA_DIRS[request.param])
    engines = {"now": EmbeddedEngine(bundle, isolate=False), "before": EmbeddedEngine(oracle_of(bundle), isolate=False)}
    for engine in engines.values():
        assert engine.compile() == []
    yield engines
    for engine in engines.values():
        engine.close()


def assert_same_decision(pair: dict[str, EmbeddedEngine], raw: dict[str, Any]) -> dict[str, Any]:
    policy_input = complete_input(raw)
    names = [t.name for t in policy_input.teams]
    decided = {
        label: to_decision(engine.raw_text(engine.input_text(policy_input)), names).model_dump(mode="json")
        for label, engine in pair.items()
    }
    found = differences(decided["before"], decided["now"])
    assert not found, f"input {raw!r}: {found}"
    return decided["now"]


def test_the_oracle_is_the_old_text_not_the_new():
    bundle = load_bundle(shipped_policy_dir())
    oracle = oracle_of(bundle)
    assert all(oracle.modules[p.name] != bundle.modules[p.name] for p in ORACLE.glob("*.rego"))
    assert "team_settings" not in oracle.modules["priorities.rego"]


@pytest.mark.parametrize("case", load_bundle(shipped_policy_dir(), data_dir=DEMO_DATA).cases, ids=lambda c: c.name)
def test_every_shipped_case_decides_as_before(pair, case):
    assert_same_decision(pair, case.input)


def test_the_bench_input_decides_as_before(pair):
    decision = assert_same_decision(pair, big_input(100, 50, 1000).model_dump(mode="json"))
    assert len(decision["teams"]) == 100


@DIFFERENTIAL
@given(raw=policy_inputs())
def test_generated_inputs_decide_as_before(pair, raw):
    assert_same_decision(pair, raw)


def test_teams_the_data_lists_with_odd_settings_decide_as_before(pair):
    """A listed team with an empty entry, a tier the data lacks, quota at its edges."""
    data = dict(pair["now"].bundle.data)
    data["priorities"] = {
        **data["priorities"],
        "teams": {
            "empty": {},
            "lost": {"tier": "no-such-tier", "quota": {"nominal_gpus": 0}},
            "lender": {"quota": {"nominal_gpus": 8, "lending_limit_gpus": 0}},
            "borrower": {"capacity": "spot_only", "quota": {"nominal_gpus": 2, "borrowing_limit_gpus": 0}},
        },
    }
    data["budgets"] = {**data["budgets"], "teams": {"empty": {"monthly_usd": 100, "kind": "hard"}, "lost": {}}}
    for engine in pair.values():
        assert engine.load_data(data) == []
    try:
        teams = [
            {"name": n, "running_gpus": g, "forecast_usd": f, "month_to_date_usd": f / 2}
            for n, g, f in (("empty", 3, 150.0), ("lost", 0, 0.0), ("lender", 1, 0.0), ("borrower", 2, 0.0))
        ]
        decision = assert_same_decision(pair, {"now": NOW, "teams": [*teams, {"name": "unlisted"}]})
        assert decision["teams"]["empty"]["may_scale_up"] is False  # frozen: the case means something
        assert decision["teams"]["borrower"]["may_scale_up"] is False  # quota full
    finally:
        for engine in pair.values():
            assert engine.compile() == []


def test_the_comparison_sees_a_changed_rule(pair):
    """A rewrite that changes a decision must fail the tests above."""
    bundle = pair["now"].bundle
    modules = dict(bundle.modules)
    modules["priorities.rego"] = modules["priorities.rego"].replace(
        '"tier": object.get(object.get(tiers, tn, {}), "tier", 0)', '"tier": 7'
    )
    assert modules["priorities.rego"] != bundle.modules["priorities.rego"]
    changed = EmbeddedEngine(PolicyBundle(bundle.directory, modules, bundle.data, "changed"), isolate=False)
    try:
        assert changed.compile() == []
        with pytest.raises(AssertionError):
            assert_same_decision({"before": pair["before"], "now": changed}, {"now": NOW, "teams": [{"name": "x"}]})
    finally:
        changed.close()
