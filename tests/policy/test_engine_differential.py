"""regorus and rego-cpp give the same decision for every input: the shipped cases, generated ones.

The decision compared is the one the autoscaler acts on (`to_decision`: validated, alerts
in a fixed order): every field, every reason string, exactly. Floats are compared to
14 significant digits or 1e-9 absolute (a billionth of a dollar or GPU), because
rego-cpp carries numbers with 15-16 digits: it prints 0.1 + 0.2 as 0.3 where regorus,
like OPA, writes 0.30000000000000004, and it reads an input amount with 16 digits, so
a difference of two near amounts (budget - forecast) differs from IEEE arithmetic in
the 14th digit. `test_rego_cpp_rounds_the_numbers_it_prints` and
`test_regorus_computes_what_ieee_arithmetic_gives` pin both, so the tolerance goes
when the reason does. The raw documents differ only where Rego leaves order free (the iteration
order of a set), which `to_decision` fixes.

The generated inputs aim at the places where interpreters have been seen to part ways:
spend exactly on a threshold or on a half percent (sprintf rounding ties), budgets and
quotas at their edges, teams the data does not list, static pools with idle machines,
queues naming pools that do not exist. `slow` runs many more of them.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import complete_input
from autoscaler.policy.engines import EmbeddedEngine, input_document, to_decision
from autoscaler.policy.interpreters import make_runtime
from autoscaler.policy.rego import RegoFailure
from tests.policy.helpers import DEMO_DATA, NOW

BUNDLE = load_bundle(shipped_policy_dir(), data_dir=DEMO_DATA)
TEAMS = ["research", "prod-inference", "interns", "vision", "nlp"]  # the last two are in no data file
POOLS = ["onprem-a100", "onprem-h100", "aws-a100", "aws-t4", "gcp-a100", "azure-a100", "aws-eu"]
REGIONS = ["local", "us-east-1", "eu-west-1", "europe-west4", "westeurope"]
BUDGETS = {"research": 20000.0, "interns": 2000.0, "prod-inference": 50000.0}


@pytest.fixture(scope="module")
def engines() -> Any:
    pair = {name: EmbeddedEngine(BUNDLE, isolate=False, interpreter=name) for name in ("regorus", "rego-cpp")}
    for engine in pair.values():
        assert engine.compile() == []
    yield pair
    for engine in pair.values():
        engine.close()


def decide(engine: EmbeddedEngine, doc: dict[str, Any], teams: list[str]) -> dict[str, Any] | str:
    """The decision as the autoscaler reads it, or the failure text (both engines must fail alike)."""
    try:
        return to_decision(engine.raw(doc), teams).model_dump(mode="json")
    except (RegoFailure, ValueError) as exc:
        return f"failed: {type(exc).__name__}"


def differences(a: Any, b: Any, path: str = "decision") -> list[str]:
    """Where two decisions differ: exact, except floats to 15 significant digits."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} != {sorted(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {a!r} != {b!r}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        close = abs(a - b) <= 1e-14 * max(abs(a), abs(b)) or abs(a - b) <= 1e-9
        return [] if close else [f"{path}: {a!r} != {b!r}"]
    return [] if type(a) is type(b) and a == b else [f"{path}: {a!r} != {b!r}"]


def decide_text(engine: EmbeddedEngine, text: str, teams: list[str]) -> dict[str, Any] | str:
    """`decide` for the text an evaluation hands the engine (only the fields the policy reads)."""
    try:
        return to_decision(engine.raw_text(text), teams).model_dump(mode="json")
    except (RegoFailure, ValueError) as exc:
        return f"failed: {type(exc).__name__}"


def assert_same(engines: dict[str, EmbeddedEngine], raw_input: dict[str, Any]) -> dict[str, Any] | str:
    """regorus on the whole document, regorus and rego-cpp on the trimmed one: one decision."""
    policy_input = complete_input(raw_input)
    doc = input_document(policy_input)
    text = engines["regorus"].input_text(policy_input)
    names = [t.name for t in policy_input.teams]
    ours = decide(engines["regorus"], doc, names)
    trimmed = decide_text(engines["regorus"], text, names)
    theirs = decide_text(engines["rego-cpp"], text, names)
    found = differences(ours, theirs) + differences(ours, trimmed)
    assert not found, f"input {raw_input!r}: {found}"
    return ours


def test_rego_cpp_rounds_the_numbers_it_prints():
    """Why floats compare to 15 digits; when rego-cpp prints exactly this fails and the tolerance can go."""
    modules = {"t.rego": "package t\nimport rego.v1\nx := 0.1 + 0.2\n"}
    values = {}
    for name in ("regorus", "rego-cpp"):
        runtime = make_runtime(name)
        try:
            runtime.load(modules, {}, "t/x")
            values[name] = runtime.evaluate({})[0]
        finally:
            runtime.close()
    assert values == {"regorus": 0.1 + 0.2, "rego-cpp": 0.3}


@pytest.mark.parametrize("tiny", [5e-324, 2.2250738585072014e-308])
def test_rego_cpp_fails_on_tiny_amounts(engines, tiny):
    """Found by the generated inputs: rego-cpp cannot read these (`stod`) and fails safe; regorus decides."""

    def doc(forecast: float) -> dict[str, Any]:
        return input_document(complete_input({"now": NOW, "teams": [{"name": "research", "forecast_usd": forecast}]}))

    assert decide(engines["rego-cpp"], doc(tiny), ["research"]) == "failed: RegoFailure"
    assert (
        differences(
            decide(engines["regorus"], doc(tiny), ["research"]), decide(engines["rego-cpp"], doc(0.0), ["research"])
        )
        == []
    )


def test_regorus_computes_what_ieee_arithmetic_gives(engines):
    """Found by the generated inputs (5,000 examples): 20000 - 19637.915248052414 over 384 h."""
    forecast = 19637.915248052414
    doc = input_document(complete_input({"now": NOW, "teams": [{"name": "research", "forecast_usd": forecast}]}))
    exact = (20000 - forecast) / 384
    ours, theirs = (decide(engines[name], doc, ["research"]) for name in ("regorus", "rego-cpp"))
    assert isinstance(ours, dict) and isinstance(theirs, dict)
    assert ours["teams"]["research"]["spend_headroom_per_hour"] == exact
    assert theirs["teams"]["research"]["spend_headroom_per_hour"] == (20000 - float(f"{forecast:.16g}")) / 384
    assert differences(ours, theirs) == []


def test_the_comparison_sees_a_difference_in_the_last_places_that_matter():
    assert differences({"a": [1.0, "x"]}, {"a": [1.0, "x"]}) == []
    assert differences(28.645833333333332, 28.64583333333333) == []  # rego-cpp's 16 digits
    assert differences(0.9429290415301731, 0.9429290415301826) == []  # rego-cpp's 16-digit input
    assert differences(28.645833, 28.645834) != [] and differences(1e12, 1e12 + 0.5) != []
    assert differences(1, 1.0) != [] and differences("102%", "103%") != []
    assert differences({"a": 1}, {"a": 1, "b": 2}) != [] and differences([1], [1, 1]) != []


@pytest.mark.parametrize("case", BUNDLE.cases, ids=[f"{c.file}:{c.name}" for c in BUNDLE.cases])
def test_every_shipped_case_decides_the_same(engines, case):
    decision = assert_same(engines, case.input)
    assert isinstance(decision, dict), decision  # a shipped case never fails


# ------------------------------------------------------------------ generated inputs


def _spend(team: str) -> st.SearchStrategy[float]:
    """Any amount, or one that lands exactly on a whole or half percent of the team's budget."""
    budget = BUDGETS.get(team, 1000.0)
    on_a_step = st.integers(0, 400).map(lambda half_pct: budget * half_pct / 200)
    # No amounts below a billionth of a dollar: rego-cpp cannot read them (test_rego_cpp_fails_on_tiny_amounts).
    anything = st.floats(0, budget * 3, allow_nan=False, allow_infinity=False).map(lambda x: x if x > 1e-9 else 0.0)
    return st.one_of(on_a_step, anything, st.just(0.0))


@st.composite
def team_row(draw: st.DrawFn, name: str) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name,
        "month_to_date_usd": draw(_spend(name)),
        "forecast_usd": draw(_spend(name)),
        "burn_rate_usd_per_hour": draw(st.floats(0, 200, allow_nan=False).map(lambda x: x if x > 1e-9 else 0.0)),
        "running_gpus": draw(st.integers(0, 64)),
        "pending_gpus": draw(st.integers(0, 32)),
    }
    if draw(st.booleans()):
        row["priority_weight"] = draw(st.sampled_from([0.5, 1.0, 2.0, 3.0]))
    return row


@st.composite
def pool_row(draw: st.DrawFn, name: str) -> dict[str, Any]:
    static = name.startswith("onprem")
    row: dict[str, Any] = {
        "name": name,
        "provider": "static" if static else name.split("-", 1)[0],
        "kind": "static" if static else "cloud",
        "region": "local" if static else draw(st.sampled_from(REGIONS[1:])),
        "current_instances": draw(st.integers(0, 20)),
        "max_instances": draw(st.integers(0, 40)),
        "idle_instances": draw(st.integers(0, 4)),
    }
    if not static and draw(st.booleans()):
        row["hourly_prices"] = {
            "a100/spot": draw(st.sampled_from([0.5, 2.5, 2.51, 9.99])),
            "a100/on_demand": draw(st.sampled_from([3.0, 30.0])),
        }
    return row


@st.composite
def policy_inputs(draw: st.DrawFn) -> dict[str, Any]:
    teams = draw(st.lists(st.sampled_from(TEAMS), unique=True, max_size=len(TEAMS)))
    pools = draw(st.lists(st.sampled_from(POOLS), unique=True, max_size=len(POOLS)))
    queue_names = draw(st.lists(st.sampled_from(["q-train", "eu-batch", "q-serve"]), unique=True, max_size=3))
    queues = [
        {
            "name": q,
            "pools": draw(st.lists(st.sampled_from(POOLS), unique=True, max_size=3)),
            "depth": draw(st.integers(0, 30)),
            "teams_waiting": draw(st.lists(st.sampled_from(TEAMS), unique=True, max_size=2)),
            "pending_gpus_by_shape": {"1xA100": draw(st.integers(0, 8))},
        }
        for q in queue_names
    ]
    day = draw(st.integers(1, 28))
    return {
        "now": draw(st.sampled_from([NOW, f"2026-02-{day:02d}T{draw(st.integers(0, 23)):02d}:30:00Z"])),
        "teams": [draw(team_row(t)) for t in teams],
        "pools": [draw(pool_row(p)) for p in pools],
        "queues": queues,
        "fleet": {"instances": draw(st.integers(0, 500))},
    }


DIFFERENTIAL = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@DIFFERENTIAL
@given(raw=policy_inputs())
def test_generated_inputs_decide_the_same(engines, raw):
    assert_same(engines, raw)


# The pool order as the policy computed it before the service handed it the pools by
# price: by counting the pools before each one (rego-cpp's sort() compares numbers as
# text). The oracle for `test_the_pool_order_is_what_counting_gave`.
COUNTED_POOL_ORDER = """package oracle

import data.autoscaler.lib
import rego.v1

cheapest(p) := lib.min_of([v | some v in p.hourly_prices]) if {
	count(p.hourly_prices) > 0
} else := 0

rank(p) := 0 if {
	p.kind == "static"
} else := 1

pool_order := [by_position[i] | some i in numbers.range(0, count(keys) - 1)] if {
	keys := [{"rank": rank(p), "price": cheapest(p), "name": p.name} | some p in input.pools]
	count(keys) > 0
	by_position := {position: k.name |
		some k in keys
		lower_rank := count([o | some o in keys; o.rank < k.rank])
		cheaper := count([o | some o in keys; o.rank == k.rank; o.price < k.price])
		same_price_earlier_name := count([o | some o in keys; o.rank == k.rank; o.price == k.price; o.name < k.name])
		position := (lower_rank + cheaper) + same_price_earlier_name
	}
} else := []
"""


@pytest.fixture(scope="module")
def counted_order() -> Any:
    runtime = make_runtime("regorus")
    runtime.load({**BUNDLE.modules, "oracle.rego": COUNTED_POOL_ORDER}, BUNDLE.data, "oracle/pool_order")
    yield runtime
    runtime.close()


@DIFFERENTIAL
@given(raw=policy_inputs(), prices=st.lists(st.sampled_from([0.5, 2.5, 9.99, 10.0, 30.0]), min_size=7, max_size=7))
def test_the_pool_order_is_what_counting_gave(engines, counted_order, raw, prices):
    """One sort in the service and on-prem first in Rego order the pools as the counting rule did."""
    for pool, price in zip(raw["pools"], prices, strict=False):
        pool.setdefault("hourly_prices", {"x/spot": price})
    policy_input = complete_input(raw)
    decision = decide(engines["regorus"], input_document(policy_input), [t.name for t in policy_input.teams])
    assert isinstance(decision, dict)
    assert decision["pool_order"] == counted_order.evaluate(input_document(policy_input))[0]


SETTINGS_AGREE = """package oracle

import data.autoscaler.priorities
import rego.v1

disagree contains name if {
	some name in input.names
	s := priorities.settings(name)
	[s.tier, s.weight, s.capacity_types, s.quota] != [
		priorities.tier(name), priorities.weight(name), priorities.capacity_types(name), priorities.quota(name),
	]
}
"""


@pytest.mark.parametrize("interpreter", ["regorus", "rego-cpp"])
def test_a_teams_settings_are_what_the_per_attribute_functions_give(interpreter):
    """decision.rego reads a team's tier, weight, capacity types and quota from one
    `priorities.settings`; it must say what the functions the other rules use say."""
    runtime = make_runtime(interpreter)
    try:
        runtime.load({**BUNDLE.modules, "oracle.rego": SETTINGS_AGREE}, BUNDLE.data, "oracle/disagree")
        names = [*TEAMS, "", "team-without-data"]
        assert runtime.evaluate({"names": names})[0] == []
        # The oracle can fail: a team whose weight is read differently is reported.
        broken = dict(BUNDLE.modules)
        broken["priorities.rego"] = broken["priorities.rego"].replace(
            '"weight": object.get(c, "weight",', '"weight": 1 + object.get(c, "weight",'
        )
        assert broken["priorities.rego"] != BUNDLE.modules["priorities.rego"]
        runtime.load({**broken, "oracle.rego": SETTINGS_AGREE}, BUNDLE.data, "oracle/disagree")
        assert sorted(runtime.evaluate({"names": names})[0]) == sorted(names)
    finally:
        runtime.close()


@pytest.mark.slow
@pytest.mark.timeout(3600)  # rego-cpp takes 20-200 ms per input here; regorus under 2 ms
@settings(DIFFERENTIAL, max_examples=5000)
@given(raw=policy_inputs())
def test_many_more_generated_inputs_decide_the_same(engines, raw):
    assert_same(engines, raw)


def test_a_half_percent_tie_prints_as_opa_prints_it(engines):
    """102.5 % of the budget: OPA and rego-cpp print 102, regorus's own %.0f would print 103."""
    decision = assert_same(engines, {"now": NOW, "teams": [{"name": "research", "month_to_date_usd": 20500}]})
    assert isinstance(decision, dict)
    assert decision["teams"]["research"]["reasons"][0] == "budget: hard budget of $20000 spent (102%); draining"


def test_the_comparison_can_fail(engines):
    """A different policy must show up as a difference, or the test above proves nothing."""
    doc = input_document(complete_input({"now": NOW, "teams": [{"name": "research", "month_to_date_usd": 20500}]}))
    decision = decide(engines["regorus"], doc, ["research"])
    assert isinstance(decision, dict)
    changed = dict(BUNDLE.data, budgets={**BUNDLE.data["budgets"], "thresholds_pct": [50, 80, 99]})
    other = EmbeddedEngine(
        type(BUNDLE)(BUNDLE.directory, BUNDLE.modules, changed, "other"), isolate=False, interpreter="rego-cpp"
    )
    try:
        assert other.compile() == []
        assert decide(other, doc, ["research"]) != decision
    finally:
        other.close()
