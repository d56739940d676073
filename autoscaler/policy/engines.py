"""The two PolicyEngine implementations: embedded Rego (default) and an OPA server.

The embedded engine runs one of two interpreters (interpreters.py): regorus (default)
or rego-cpp.

Both share one rule: `evaluate` never raises for a policy or engine problem. A failed,
undefined, malformed or timed-out evaluation returns `Decision.failed(...)`: no team
may add capacity this cycle, running work is untouched, and the error is carried in
the result so the reconciler records it.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import ValidationError

from autoscaler.ledger.period import hours_between, month_bounds
from autoscaler.policy.bundle import PolicyBundle, entrypoint
from autoscaler.policy.input_fields import InputSelection
from autoscaler.policy.interpreters import DEFAULT_INTERPRETER, Runtime, make_runtime
from autoscaler.policy.isolation import EngineUnavailable, IsolatedRego
from autoscaler.policy.problems import Problem
from autoscaler.policy.rego import RegoFailure
from autoscaler.policy.schema import Decision, EvaluationResult, PolicyInput


def derived_input(policy_input: PolicyInput) -> PolicyInput:
    """The input with the facts the service derives for the policies.

    Per pool, `backlog` (tasks queued in the queues it serves) and `onprem_idle_peers`
    (idle on-prem machines serving one of those queues); `pools_by_price`, the pool
    names by cheapest hourly price, then name. These joins and orders are done here, in
    linear time (one sort), rather than in Rego: rego-cpp re-evaluates rules inside
    loops (the joins took tens of seconds for 50 pools x 1,000 queues) and compares
    numbers as text in `sort()`, so ordering the pools in Rego took counting
    (docs/benchmarks.md).
    """
    idle_static = {p.name: p.idle_instances for p in policy_input.pools if p.kind == "static"}
    backlog: dict[str, int] = {}
    # Per pool, the static pools it shares a queue with, itself included (dropped below:
    # the union over queues of "the others" is the union less the pool itself).
    peers: dict[str, set[str]] = {}
    for q in policy_input.queues:
        names, depth = q.pools, q.depth
        if depth:
            for name in names:
                backlog[name] = backlog.get(name, 0) + depth
        if idle_static:
            served_static = [s for s in names if s in idle_static]
            if served_static:
                for name in names:
                    if name in peers:
                        peers[name].update(served_static)
                    else:
                        peers[name] = set(served_static)
    for name, shared in peers.items():
        shared.discard(name)
    pools = [
        p.model_copy(
            update={
                "backlog": backlog.get(p.name, 0),
                "onprem_idle_peers": sum(idle_static[s] for s in peers.get(p.name, ())),
            }
        )
        for p in policy_input.pools
    ]
    by_price = sorted(policy_input.pools, key=lambda p: (min(p.hourly_prices.values(), default=0), p.name))
    return policy_input.model_copy(update={"pools": pools, "pools_by_price": [p.name for p in by_price]})


def input_document(policy_input: PolicyInput) -> dict[str, Any]:
    """The whole JSON document a policy may see (datetimes as RFC 3339 strings), derived facts included."""
    doc: dict[str, Any] = derived_input(policy_input).model_dump(mode="json")
    return doc


def input_text(policy_input: PolicyInput, selection: InputSelection | None = None) -> str:
    """The document the engine is handed, as JSON text: only the fields `selection`
    keeps (input_fields.py), written in one pass by pydantic's serialiser (about ten
    times faster than dumping to Python objects and encoding those)."""
    exclude = selection.exclude if selection is not None else None
    return derived_input(policy_input).model_dump_json(exclude=exclude)


def text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def billing_period(now: datetime) -> tuple[datetime, datetime, float]:
    """Budget month = calendar month, UTC: (start, end, hours left)."""
    start, end = month_bounds(now)
    return start, end, hours_between(now.astimezone(UTC), end)


def to_decision(value: Any, team_names: list[str]) -> Decision:
    """Validate a policy's answer; raise ValueError with a readable reason if it is not a Decision."""
    if value is None:
        raise ValueError("the policy's decision is undefined (a rule it depends on did not match)")
    if not isinstance(value, dict):
        raise ValueError(f"the policy's decision must be an object, got {type(value).__name__}")
    try:
        decision = Decision.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ValueError(
            f"the policy's decision does not match schema v1 ({exc.error_count()} problem(s)); at {loc}: {first['msg']}"
        ) from None
    missing = [t for t in team_names if t not in decision.teams]
    if missing:
        # A team silently falling back to the permissive default is how budgets leak.
        decision.warn.append(f"policy gave no decision for team(s) {', '.join(missing)}; default_team applies")
    decision.alerts.sort(key=lambda a: (a.team or "", a.basis, a.threshold_pct, a.level))
    return decision


class EmbeddedEngine:
    """Rego evaluated by an embedded interpreter (regorus or rego-cpp) from a bundle.

    `isolate=True` (the service) runs the interpreter in a child process with a timeout.
    `isolate=False` runs it in this process: for the simulator and `policy` CLI
    commands, which evaluate thousands of times and where an engine crash ends only
    that run, not a service others depend on; it also has no timeout.
    """

    def __init__(
        self,
        bundle: PolicyBundle,
        *,
        package: str = "autoscaler",
        timeout_s: float = 2.0,
        isolate: bool = True,
        interpreter: str = DEFAULT_INTERPRETER,
    ) -> None:
        self.bundle = bundle
        self.package = package
        self.interpreter = interpreter
        self.backend: IsolatedRego | Runtime = (
            IsolatedRego(timeout_s, interpreter) if isolate else make_runtime(interpreter)
        )
        self._entrypoint = entrypoint(package)
        # Which input fields the loaded policy can read; follows the data loaded with
        # it (a test case's data may name other fields).
        self.selection = InputSelection.for_policy(bundle.modules, bundle.data)

    @property
    def revision(self) -> str:
        return self.bundle.revision

    def compile(self) -> list[Problem]:
        """Load the bundle into the engine; returns problems instead of raising."""
        return self.load_data(self.bundle.data)

    def load_data(self, data: dict[str, Any]) -> list[Problem]:
        """Load the bundle's rules with other data (a test case's); `compile()` puts the
        bundle's own data back."""
        self.selection = InputSelection.for_policy(self.bundle.modules, data)
        try:
            self.backend.load(self.bundle.modules, data, self._entrypoint)
        except RegoFailure as exc:
            return exc.problems
        except EngineUnavailable as exc:
            return [Problem("(engine)", None, str(exc))]
        return []

    def input_text(self, policy_input: PolicyInput) -> str:
        """The input as this engine is handed it: the fields the loaded policy can read."""
        return input_text(policy_input, self.selection)

    def raw_text(self, text: str) -> Any:
        """`raw` for an input already serialised (raises RegoFailure/EngineUnavailable)."""
        value, _ = self.backend.evaluate_text(text)
        return value

    def raw(self, doc: dict[str, Any]) -> Any:
        """The decision document as the policy wrote it (raises RegoFailure/EngineUnavailable)."""
        value, _ = self.backend.evaluate(doc)
        return value

    def evaluate(self, policy_input: PolicyInput) -> EvaluationResult:
        # One serialisation serves the digest and the engine.
        text = self.input_text(policy_input)
        digest = text_digest(text)
        names = [t.name for t in policy_input.teams]
        started = time.perf_counter()
        try:
            value, _ = self.backend.evaluate_text(text)
            decision = to_decision(value, names)
            error = None
        except (RegoFailure, EngineUnavailable, ValueError) as exc:
            error = str(exc)
            decision = Decision.failed(error, names)
        eval_ms = (time.perf_counter() - started) * 1000
        return EvaluationResult(
            decision=decision, revision=self.revision, input_digest=digest, eval_ms=eval_ms, error=error
        )

    def close(self) -> None:
        self.backend.close()


class OpaEngine:
    """An OPA server over REST: `POST /v1/data/<package>/decision` with `{"input": ...}`.

    OPA owns its bundles, so the revision is what OPA reports in `provenance`
    (when it serves a bundle) or `opa:<package>`; the decision id is recorded.
    """

    def __init__(
        self,
        url: str,
        *,
        package: str = "autoscaler",
        timeout_s: float = 2.0,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.package = package
        self.timeout_s = timeout_s
        self._client = client or httpx.Client(timeout=timeout_s)
        self._revision = f"opa:{package}"

    @property
    def revision(self) -> str:
        return self._revision

    def _call(self, text: str) -> tuple[Any, str | None]:
        path = f"{self.url}/v1/data/{entrypoint(self.package)}"
        try:
            resp = self._client.post(
                path,
                content='{"input":' + text + "}",
                headers={"Content-Type": "application/json"},
                params={"provenance": "true"},
                timeout=self.timeout_s,
            )
        except httpx.TimeoutException:
            raise ValueError(f"OPA at {self.url} did not answer within {self.timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise ValueError(f"OPA at {self.url} is unreachable: {exc}") from None
        if resp.status_code != 200:
            try:
                body = resp.json()
                detail = f"{body.get('code', '')}: {body.get('message', '')}".strip(": ")
            except ValueError:
                detail = resp.text[:200]
            raise ValueError(f"OPA answered HTTP {resp.status_code}: {detail}")
        try:
            body = resp.json()
        except ValueError:
            raise ValueError("OPA answered 200 with a body that is not JSON") from None
        bundles = (body.get("provenance") or {}).get("bundles") or {}
        revisions = sorted(f"{name}@{b.get('revision', '')}" for name, b in bundles.items())
        if revisions:
            self._revision = "opa:" + ",".join(revisions)
        if "result" not in body:
            raise ValueError(
                f"OPA returned an undefined document for data.{self.package}.{'decision'}: "
                "is the policy loaded in OPA, under that package?"
            )
        return body["result"], body.get("decision_id")

    def evaluate(self, policy_input: PolicyInput) -> EvaluationResult:
        # OPA is handed the whole input: its policies are not loaded here to be read.
        text = input_text(policy_input)
        digest = text_digest(text)
        names = [t.name for t in policy_input.teams]
        started = time.perf_counter()
        decision_id = None
        try:
            value, decision_id = self._call(text)
            decision = to_decision(value, names)
            error = None
        except ValueError as exc:
            error = str(exc)
            decision = Decision.failed(error, names)
        eval_ms = (time.perf_counter() - started) * 1000
        return EvaluationResult(
            decision=decision,
            revision=self.revision,
            input_digest=digest,
            eval_ms=eval_ms,
            decision_id=decision_id,
            error=error,
        )

    def close(self) -> None:
        self._client.close()
