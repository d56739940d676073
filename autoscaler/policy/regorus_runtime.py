"""regorus (PyPI `gordon-to-regorus`, the Rust Rego interpreter) behind the runtime interface.

The same operations as `rego.RegoRuntime` (load, evaluate, unknown_functions, close),
so `isolation.py` and the in-process engine can run either. regorus reports every
failure as a RuntimeError whose text is `--> file:line:col`, the source line, a caret
and `error: message`, followed by a Rust stack backtrace when RUST_BACKTRACE is set;
we keep the location and the message and drop the rest. Unlike rego-cpp it needs no
per-rule diagnosis: a conflict or a failed builtin already names its file and line.

A regorus Engine is bound to the thread that made it (the binding is a pyo3
`unsendable` class: touching or dropping it on another thread raises). So every
engine is made, used and dropped on one thread: calls from the thread that made the
runtime (its home: the simulator's and the CLI's only thread, the engine child's)
run right there, on an engine kept in that thread's slot of a module-level
`threading.local`; calls from any other thread (the service in-process: request
threads and the reconcile thread) go to one owner thread with its own engine. Each
engine is rebuilt from the last good `load` the first time it is used after one, so
both answer the same policy. The hand-off to the owner (a queue put, a wake-up, a
future) is a tenth of a millisecond quiet and several on a loaded machine, against a
one-team evaluation of a few tenths: that is why the home thread does not take it.
`same_thread` (the engine's child) refuses calls from other threads instead.

Why regorus is the default and what was measured: docs/policies.md and
docs/benchmarks.md.
"""

from __future__ import annotations

import itertools
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
_Spec = tuple[dict[str, str], dict[str, Any], str]  # modules, data, rule: what `load` was given

# Per thread: {runtime serial: engine state} of the runtimes made on that thread. A
# thread's slot is cleared on that thread when it ends; see `_Home` for the rest.
_HOME_STATES = threading.local()
_SERIALS = itertools.count(1)
_COLLECTED_ELSEWHERE: set[int] = set()  # serials of runtimes collected off their home thread


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


def _states_here() -> dict[int, dict[str, Any]]:
    states: dict[int, dict[str, Any]] | None = getattr(_HOME_STATES, "states", None)
    if states is None:
        states = _HOME_STATES.states = {}
    # Engines of runtimes collected on another thread, dropped now, on their own.
    for serial in _COLLECTED_ELSEWHERE & states.keys():
        del states[serial]
        _COLLECTED_ELSEWHERE.discard(serial)
    return states


def _release(serial: int, home: int) -> None:
    """The runtime is gone: drop its home engine now if this is its thread, else mark it
    for its thread's next call (or exit) to drop."""
    if threading.get_ident() == home:
        _states_here().pop(serial, None)
    else:
        _COLLECTED_ELSEWHERE.add(serial)


class _Home:
    """Runs calls on the thread that made the runtime, on that thread's engine."""

    def __init__(self, holder: object) -> None:
        self._serial = next(_SERIALS)
        self._thread = threading.get_ident()
        self._release = weakref.finalize(holder, _release, self._serial, self._thread)

    def here(self) -> bool:
        return threading.get_ident() == self._thread

    def call(self, fn: Callable[[dict[str, Any]], T]) -> T:
        return fn(_states_here().setdefault(self._serial, {}))

    def stop(self) -> None:
        self._release()


class RegorusRuntime:
    """One compiled policy in regorus Engines (one per thread that calls it: its home
    thread's and the owner thread's), queried at one rule.

    `same_thread=True` is for a process that calls it from the thread that made it and
    no other (the engine's child process): a call from another thread is refused.
    """

    def __init__(self, *, same_thread: bool = False) -> None:
        self._home = _Home(self)
        self._same_thread = same_thread
        self._owner: _Owner | None = None  # started at the first call from another thread
        self._lock = threading.Lock()
        self._spec: _Spec | None = None
        self._generation = 0  # of the last good load; each engine rebuilds when behind

    def _executor(self) -> _Home | _Owner:
        if self._home.here():
            return self._home
        if self._same_thread:
            raise RuntimeError(
                "a same_thread RegorusRuntime was called from another thread: make it without same_thread"
            )
        with self._lock:
            if self._owner is None:
                self._owner = _Owner(self)
            return self._owner

    def _on_current(self, fn: Callable[[dict[str, Any]], T]) -> T:
        """Run `fn` on this thread's executor, its engine brought up to the last good load."""
        executor = self._executor()
        with self._lock:
            spec, generation = self._spec, self._generation

        def current(state: dict[str, Any]) -> T:
            if spec is not None and state.get("generation", 0) < generation:
                _load(state, *spec)
                state["generation"] = generation
            return fn(state)

        return executor.call(current)

    def load(self, modules: dict[str, str], data: dict[str, Any], entrypoint: str) -> None:
        """Parse every module and the data; raises RegoFailure with file:line problems
        (and then every engine keeps the last good load)."""
        spec: _Spec = (modules, data, rule_path(entrypoint))
        executor = self._executor()
        with self._lock:  # one load at a time; the next generation is this one's
            generation = self._generation + 1

            def build(state: dict[str, Any]) -> None:
                _load(state, *spec)
                state["generation"] = generation

            executor.call(build)
            self._spec, self._generation = spec, generation

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
        out = self._on_current(lambda state: _evaluate(state, input_text))
        value = None if out.strip() == _UNDEFINED else json.loads(out)
        return value, (time.perf_counter() - started) * 1000

    def unknown_functions(self, names: list[str]) -> list[str]:
        """Names regorus has no builtin for."""
        return self._executor().call(lambda _state: _unknown(names))

    def close(self) -> None:
        self._home.stop()
        if self._owner is not None:
            self._owner.stop()
