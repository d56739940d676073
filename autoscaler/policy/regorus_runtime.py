"""regorus (PyPI `gordon-to-regorus`, the Rust Rego interpreter) behind the runtime interface.

The same operations as `rego.RegoRuntime` (load, evaluate, unknown_functions, close),
so `isolation.py` and the in-process engine can run either. regorus reports every
failure as a RuntimeError whose text is `--> file:line:col`, the source line, a caret
and `error: message`, followed by a Rust stack backtrace when RUST_BACKTRACE is set;
we keep the location and the message and drop the rest. Unlike rego-cpp it needs no
per-rule diagnosis: a conflict or a failed builtin already names its file and line.

A regorus Engine is bound to the thread that made it (the binding is a pyo3
`unsendable` class: touching or dropping it on another thread raises). The service
calls the policy from request threads and the reconcile thread alike, so the runtime
owns one thread that creates, uses and drops its engine, and hands every call to it.
The engine's child process (isolation.py) has one thread and serves one request at a
time, so there the runtime is made `same_thread`: calls run on the calling thread,
without the hand-off (a queue put, a wake-up, a future: a tenth of a millisecond
quiet, more on a loaded machine, against a one-team evaluation of a few tenths).

Why regorus is the default and what was measured: docs/policies.md and
docs/benchmarks.md.
"""

from __future__ import annotations

import json
import queue
import re
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from autoscaler.policy.problems import Problem
from autoscaler.policy.rego import RegoFailure

_LOCATION = re.compile(r"-->\s*(?P<file>.+?):(?P<line>\d+):(?P<col>\d+)")
_ERROR = re.compile(r"^error:\s*(?P<message>.+)$", re.MULTILINE)
_NOT_A_RULE = "not a valid rule path"
_NO_FUNCTION = "could not find function"
# What eval_rule_as_json writes for an undefined rule. A decision must be an object, so a
# policy whose decision really is this string loses nothing by reading it as undefined.
_UNDEFINED = '"<undefined>"'
T = TypeVar("T")
_Call = tuple[Callable[[dict[str, Any]], Any], Future[Any]]


def parse_error(text: str, fallback_file: str = "(policy)") -> Problem:
    """One regorus error message as a file:line:col problem."""
    text = text.split("Stack backtrace:", 1)[0].strip()
    where = _LOCATION.search(text)
    said = _ERROR.search(text)
    message = said.group("message").strip() if said else (text.splitlines()[0] if text else "evaluation failed")
    if where is None:
        return Problem(fallback_file, None, message)
    return Problem(where.group("file"), int(where.group("line")), message, int(where.group("col")))


def rule_path(entrypoint: str) -> str:
    """`autoscaler/decision` (the rego-cpp entrypoint form) as the rule regorus evaluates."""
    return "data." + entrypoint.replace("/", ".")


def _serve(calls: queue.SimpleQueue[_Call | None]) -> None:
    """The owner thread: every engine lives in `state`, here, and dies here."""
    state: dict[str, Any] = {}
    while (item := calls.get()) is not None:
        fn, future = item
        try:
            future.set_result(fn(state))
        except BaseException as exc:  # handed to the caller, re-raised on its thread
            # Without its traceback and context: their frames hold the engine, which
            # would then be dropped on the caller's thread.
            exc.__context__ = exc.__cause__ = None
            future.set_exception(exc.with_traceback(None))
        del item, fn, future
    state.clear()


class _Owner:
    """One thread that runs functions of the engine state, one at a time, in call order."""

    def __init__(self, holder: object) -> None:
        self._calls: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=_serve, args=(self._calls,), name="regorus", daemon=True)
        self._thread.start()
        # The thread must not outlive its runtime: stop it when the runtime is collected.
        self._stop = weakref.finalize(holder, self._calls.put, None)

    def call(self, fn: Callable[[dict[str, Any]], T]) -> T:
        future: Future[T] = Future()
        self._calls.put((fn, future))
        return future.result()

    def stop(self) -> None:
        self._stop()
        self._thread.join(timeout=5)


def _load(state: dict[str, Any], modules: dict[str, str], data: dict[str, Any], rule: str) -> None:
    import regorus

    engine = regorus.Engine()
    problems: list[Problem] = []
    for rel, source in sorted(modules.items()):
        try:
            engine.add_policy(rel, source)
        except RuntimeError as exc:
            # Keep going: one broken file should not hide the problems of the next.
            problems.append(parse_error(str(exc), rel))
    if problems:
        raise RegoFailure(problems)
    engine.add_data(data)
    package = rule.rsplit(".", 1)[0]
    if package not in engine.get_packages():
        raise RegoFailure(
            [Problem("(policy)", None, f"no module declares package {package[5:]}: {rule} cannot be evaluated")]
        )
    state["engine"], state["rule"] = engine, rule


def _evaluate(state: dict[str, Any], text: str) -> str:
    engine = state.get("engine")
    if engine is None:
        raise RegoFailure([Problem("(policy)", None, "no policy loaded")])
    try:
        engine.set_input_json(text)
        out: str = engine.eval_rule_as_json(state["rule"])
    except RuntimeError as exc:
        problem = parse_error(str(exc))
        if problem.message == _NOT_A_RULE:
            problem = Problem(
                "(policy)", None, f"{state['rule']} is not a rule of the policy: define it in its package"
            )
        raise RegoFailure([problem]) from None
    return out


def _unknown(names: list[str]) -> list[str]:
    import regorus

    unknown = []
    for name in names:
        # A call with no arguments either fails its arity check (a builtin) or is unknown.
        probe = regorus.Engine()
        probe.add_policy("probe.rego", f"package probe\nimport rego.v1\np := {name}()\n")
        try:
            probe.eval_rule("data.probe.p")
        except RuntimeError as exc:
            if _NO_FUNCTION in str(exc):
                unknown.append(name)
    return unknown


class _Here:
    """Runs the functions on the calling thread, which must be the one that made it."""

    def __init__(self) -> None:
        self._state: dict[str, Any] = {}
        self._thread = threading.get_ident()

    def call(self, fn: Callable[[dict[str, Any]], T]) -> T:
        if threading.get_ident() != self._thread:
            raise RuntimeError(
                "a same_thread RegorusRuntime was called from another thread: make it without same_thread"
            )
        return fn(self._state)

    def stop(self) -> None:
        if threading.get_ident() == self._thread:
            self._state.clear()


class RegorusRuntime:
    """One compiled policy in a regorus Engine, queried at one rule.

    `same_thread=True` is for a process that calls it from the thread that made it and
    no other (the engine's child process); any other caller gets the owner thread.
    """

    def __init__(self, *, same_thread: bool = False) -> None:
        self._owner: _Owner | _Here = _Here() if same_thread else _Owner(self)

    def load(self, modules: dict[str, str], data: dict[str, Any], entrypoint: str) -> None:
        """Parse every module and the data; raises RegoFailure with file:line problems."""
        rule = rule_path(entrypoint)
        self._owner.call(lambda state: _load(state, modules, data, rule))

    def evaluate(self, policy_input: dict[str, Any]) -> tuple[Any, float]:
        """The rule's value (None when undefined) and the evaluation time in ms."""
        return self.evaluate_text(json.dumps(policy_input))

    def evaluate_text(self, input_text: str) -> tuple[Any, float]:
        """`evaluate` for an input already serialised as JSON (what the child receives).

        regorus reads JSON text faster than it converts a Python dict, and its JSON
        output writes a set as a sorted array (its Python conversion fails on a set of
        objects), so both ends go through JSON.
        """
        started = time.perf_counter()
        out = self._owner.call(lambda state: _evaluate(state, input_text))
        value = None if out.strip() == _UNDEFINED else json.loads(out)
        return value, (time.perf_counter() - started) * 1000

    def unknown_functions(self, names: list[str]) -> list[str]:
        """Names regorus has no builtin for."""
        return self._owner.call(lambda _state: _unknown(names))

    def close(self) -> None:
        self._owner.stop()
