"""The engine is handed only the input fields the loaded policies can read, and never fewer.

The promise tried here is the unsafe direction: a field some policy reads must be
sent, however it reads it (a path, `input.queues[_].depth`, a string key, a key held in
the data), and a policy that can see keys it does not name gets everything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.cases import complete_input
from autoscaler.policy.engines import EmbeddedEngine, input_document, input_text
from autoscaler.policy.input_fields import InputSelection, code_only
from autoscaler.policy.schema import PolicyInput
from tests.policy.helpers import DEMO_DATA, NOW, write_module

SHIPPED = load_bundle(shipped_policy_dir(), data_dir=DEMO_DATA)


def queues_input() -> PolicyInput:
    return complete_input(
        {
            "now": NOW,
            "queues": [
                {"name": "q-deep", "pools": ["p"], "depth": 25, "pending_gpus_by_shape": {"1xA100": 4}},
                {"name": "q-shallow", "pools": ["p"], "depth": 2},
            ],
            "pools": [{"name": "p", "provider": "aws"}],
        }
    )


def engine_for(tmp_path: Path, source: str, data: dict[str, Any] | None = None) -> EmbeddedEngine:
    """A policy of one module (package autoscaler), compiled in-process with regorus."""
    directory = tmp_path / "mine"
    (directory / "data").mkdir(parents=True)
    write_module(directory, "decision.rego", source)
    if data is not None:
        (directory / "data" / "extra.json").write_text(json.dumps(data))
    engine = EmbeddedEngine(load_bundle(directory), isolate=False)
    assert engine.compile() == []
    return engine


def warn_of(engine: EmbeddedEngine, policy_input: PolicyInput) -> list[str]:
    result = engine.evaluate(policy_input)
    assert result.error is None, result.error
    return result.decision.warn


DEPTH_BY_PATH = """package autoscaler

import rego.v1

decision := {"warn": [sprintf("%d task(s) queued", [sum([d | d := input.queues[_].depth])])]}
"""


def test_the_shipped_policies_are_not_handed_what_they_do_not_read():
    left_out = set(InputSelection.for_policy(SHIPPED.modules, SHIPPED.data).left_out)
    assert {"queues.depth", "queues.teams_waiting", "queues.pending_gpus_by_shape", "pools.spot_offerings"} <= left_out
    # ... and are handed what they do read.
    kept = {"queues.name", "queues.pools", "pools.kind", "pools.backlog", "pools_by_price", "teams.running_gpus"}
    assert not kept & left_out
    big = queues_input()
    trimmed = json.loads(input_text(big, InputSelection.for_policy(SHIPPED.modules, SHIPPED.data)))
    assert [q["name"] for q in trimmed["queues"]] == ["q-deep", "q-shallow"]
    assert not {"depth", "teams_waiting", "pending_gpus_by_shape"} & set(trimmed["queues"][0])


def test_a_user_policy_reading_a_queues_depth_is_handed_it(tmp_path):
    engine = engine_for(tmp_path, DEPTH_BY_PATH)
    try:
        assert "queues.depth" not in engine.selection.left_out
        assert warn_of(engine, queues_input()) == ["27 task(s) queued"]
        # The same evaluation with depth left out (the shipped policies' selection)
        # decides otherwise: the selection is what carries the field.
        engine.selection = InputSelection.for_policy(SHIPPED.modules, SHIPPED.data)
        assert warn_of(engine, queues_input()) == ["0 task(s) queued"]
    finally:
        engine.close()


@pytest.mark.parametrize(
    "read",
    [
        'object.get(q, "depth", 0) > 10',  # a key in a string
        "q.depth > 10",
        'q["depth"] > 10',
        "q[data.extra.field] > 10",  # a key held in the data
    ],
)
def test_every_way_of_naming_a_field_sends_it(tmp_path, read):
    source = f"""package autoscaler

import rego.v1

decision := {{"warn": [sprintf("%s is deep", [q.name]) | some q in input.queues; {read}]}}
"""
    engine = engine_for(tmp_path, source, data={"field": "depth"})
    try:
        assert warn_of(engine, queues_input()) == ["q-deep is deep"]
    finally:
        engine.close()


@pytest.mark.parametrize(
    "escape",
    [
        "x := input",  # the whole document as a value
        "x := json.marshal(input.queues)",
        "x := object.keys(input.queues[0])",
        "x := [k | walk(input, [k, _])]",
        "x := f(input)\n\nf(doc) := doc",
    ],
)
def test_a_policy_that_can_see_keys_it_does_not_name_gets_everything(escape):
    modules = {"a.rego": f"package autoscaler\n\nimport rego.v1\n\n{escape}\n"}
    assert InputSelection.for_policy(modules, {}).exclude is None


def test_input_in_comments_and_strings_does_not_turn_the_trimming_off():
    modules = {"a.rego": '# the whole input (all of it)\npackage a\n\nmsg := "input (sic) walk(x)"\nn := input.teams\n'}
    selection = InputSelection.for_policy(modules, {})
    assert selection.exclude is not None and "queues" in selection.left_out
    assert code_only('a := "x # y" # z\nb := `raw "input"`\n') == 'a := "" \nb := ""\n'


def test_a_field_named_only_in_a_comment_is_sent():
    """The documented way to make sure a field is sent."""
    modules = {
        "a.rego": "package a\n\n# reads pending_gpus_by_shape through keys built at run time\nn := input.queues\n"
    }
    assert "queues.pending_gpus_by_shape" not in InputSelection.for_policy(modules, {}).left_out


def test_everything_sent_is_the_whole_document():
    """The text the engine is handed (pydantic's serialiser) is the document a policy sees."""
    policy_input = queues_input()
    assert json.loads(input_text(policy_input)) == input_document(policy_input)
    assert json.loads(input_text(policy_input, InputSelection.everything())) == input_document(policy_input)


def test_pools_are_ordered_by_cheapest_price_as_numbers_then_name():
    policy_input = complete_input(
        {
            "now": NOW,
            "pools": [
                {"name": "b-ten", "provider": "aws", "hourly_prices": {"x/spot": 10.0, "x/on_demand": 30.0}},
                {"name": "a-nine", "provider": "aws", "hourly_prices": {"x/on_demand": 9.5}},
                {"name": "c-none", "provider": "static", "kind": "static"},
                {"name": "a-ten", "provider": "gcp", "hourly_prices": {"y/spot": 10.0}},
            ],
        }
    )
    assert input_document(policy_input)["pools_by_price"] == ["c-none", "a-nine", "a-ten", "b-ten"]
