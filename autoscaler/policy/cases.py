"""Checking a policy directory and running its table-driven test cases.

The same code serves `autoscaler policy check|test` and the service's hot reload, so a
policy that passes `policy test` on a laptop is exactly one the service will accept.

A case is an input (times may be left out: the billing period is derived from `now`)
and the expected part of the decision: mappings match on the keys given, lists match
element by element, numbers match within the case's `tolerance` (relative; absolute
below 1; default 1e-6). Anything the case does not mention is free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from autoscaler.policy.bundle import PolicyBundle, TestCase
from autoscaler.policy.engines import EmbeddedEngine, billing_period, to_decision
from autoscaler.policy.isolation import EngineUnavailable
from autoscaler.policy.lint import lint
from autoscaler.policy.problems import PolicyError, Problem
from autoscaler.policy.rego import RegoFailure
from autoscaler.policy.schema import PolicyInput


def complete_input(raw: dict[str, Any]) -> PolicyInput:
    """Validate an input document, deriving the billing period from `now` when left out."""
    doc = dict(raw)
    try:
        probe = PolicyInput.model_validate(
            {
                **doc,
                "billing_period_start": doc.get("billing_period_start", doc.get("now")),
                "billing_period_end": doc.get("billing_period_end", doc.get("now")),
                "hours_left_in_period": doc.get("hours_left_in_period", 0),
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise PolicyError(f"invalid policy input at {loc}: {first['msg']}") from None
    start, end, left = billing_period(probe.now)
    doc.setdefault("billing_period_start", start.isoformat())
    doc.setdefault("billing_period_end", end.isoformat())
    doc.setdefault("hours_left_in_period", left)
    return PolicyInput.model_validate(doc)


DEFAULT_TOLERANCE = 1e-6


def mismatches(expected: Any, actual: Any, path: str = "", tolerance: float = DEFAULT_TOLERANCE) -> list[str]:
    """Where `actual` differs from the part of it that `expected` describes. Numbers
    match when they differ by at most `tolerance` x max(1, |expected|)."""
    here = path or "decision"
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            return [f"{here}: expected a mapping, got {actual!r}"]
        out: list[str] = []
        for key, want in expected.items():
            if key not in actual:
                out.append(f"{here}.{key}: missing (expected {want!r})")
            else:
                out += mismatches(want, actual[key], f"{here}.{key}", tolerance)
        return out
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            return [f"{here}: expected {expected!r}, got {actual!r}"]
        out = []
        for i, (want, got) in enumerate(zip(expected, actual, strict=True)):
            out += mismatches(want, got, f"{here}[{i}]", tolerance)
        return out
    if isinstance(expected, bool) or expected is None or isinstance(expected, str):
        return (
            []
            if expected == actual and type(expected) is type(actual)
            else [f"{here}: expected {expected!r}, got {actual!r}"]
        )
    if isinstance(expected, int | float):
        if isinstance(actual, bool) or not isinstance(actual, int | float):
            return [f"{here}: expected {expected!r}, got {actual!r}"]
        return (
            []
            if abs(expected - actual) <= tolerance * max(1.0, abs(expected))
            else [f"{here}: expected {expected!r}, got {actual!r}{_within(expected, actual, tolerance)}"]
        )
    return [] if expected == actual else [f"{here}: expected {expected!r}, got {actual!r}"]


def _within(expected: float, actual: float, tolerance: float) -> str:
    # Whole numbers are compared exactly in practice; the tolerance is news for fractions.
    return f" (tolerance {tolerance:g})" if isinstance(expected, float) or isinstance(actual, float) else ""


@dataclass
class CaseResult:
    case: TestCase
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class Report:
    revision: str
    problems: list[Problem] = field(default_factory=list)
    results: list[CaseResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(r.passed for r in self.results)

    def summary(self) -> str:
        if self.problems:
            return f"{len(self.problems)} problem(s): " + "; ".join(str(p) for p in self.problems)
        failed = [r for r in self.results if not r.passed]
        if failed:
            first = failed[0]
            return (
                f"{len(failed)} of {len(self.results)} test case(s) failed; first: "
                f"{first.case.file} '{first.case.name}': {first.failures[0]}"
            )
        return f"ok: {len(self.results)} test case(s) passed"


def check(bundle: PolicyBundle, engine: EmbeddedEngine) -> list[Problem]:
    """Compile in the engine, then the leniency lint."""
    problems = engine.compile()
    if problems:
        return problems

    def unknown(names: list[str]) -> list[str]:
        return engine.backend.unknown_functions(names)

    try:
        return lint(bundle.modules, bundle.data, unknown)
    except (RegoFailure, EngineUnavailable) as exc:
        return [Problem("(engine)", None, f"lint could not run: {exc}")]


def run_case(engine: EmbeddedEngine, case: TestCase) -> CaseResult:
    try:
        policy_input = complete_input(case.input)
    except PolicyError as exc:
        return CaseResult(case, [exc.message])
    # Through the path evaluations take: the fields the policy can read, as text.
    text = engine.input_text(policy_input)
    try:
        value = engine.raw_text(text)
        decision = to_decision(value, [t.name for t in policy_input.teams])
    except RegoFailure as exc:
        return CaseResult(case, [str(p) for p in exc.problems])
    except (EngineUnavailable, ValueError) as exc:
        return CaseResult(case, [str(exc)])
    actual = decision.model_dump(mode="json")
    return CaseResult(case, mismatches(case.expect, actual, tolerance=case.tolerance) + present(case.absent, actual))


def present(paths: tuple[str, ...], actual: dict[str, Any]) -> list[str]:
    """Failures for dotted paths (`pools.aws-a100`) that exist but should not."""
    out = []
    for path in paths:
        node: Any = actual
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
            if node is None:
                break
        if node is not None:
            out.append(f"decision.{path}: expected absent, got {node!r}")
    return out


def check_and_test(bundle: PolicyBundle, engine: EmbeddedEngine) -> Report:
    """Check the bundle, then run its cases: first those on the bundle's own data, then
    each group of cases that brings other data (loaded once per group), in file order
    within a group; the engine ends with the bundle's data loaded again."""
    report = Report(revision=bundle.revision, problems=check(bundle, engine))
    if report.problems:
        return report
    results: dict[int, CaseResult] = {}
    groups: dict[str, list[int]] = {}
    for i, case in enumerate(bundle.cases):
        if case.data is None:
            results[i] = run_case(engine, case)
        else:
            groups.setdefault(json.dumps(case.data, sort_keys=True, default=str), []).append(i)
    for indices in groups.values():
        data = bundle.cases[indices[0]].data
        assert data is not None
        problems = engine.load_data(data)
        for i in indices:
            results[i] = (
                run_case(engine, bundle.cases[i])
                if not problems
                else CaseResult(bundle.cases[i], [f"the case's data cannot be loaded: {p}" for p in problems])
            )
    if groups:
        report.problems = engine.compile()
    report.results = [results[i] for i in range(len(bundle.cases))]
    return report
