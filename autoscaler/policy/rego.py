"""rego-cpp (PyPI `regopy`) behind a small, honest interface.

The wrapper's sharp edges are smoothed here so nothing else has to know them:
compile errors arrive as an AST dump (we extract file, line and message from it);
the readable copy is printed on C-level stdout (we swallow it); a query that fails
(unknown function, conflicting values, unbound variable) comes back as a non-JSON
string or an error blob inside the JSON (we turn it into a message); an undefined
decision is the string "undefined". When a query fails we evaluate each rule of the
policy on its own to name the rule, file and line that broke.

This module runs inside the engine's child process (see `isolation.py`); the
simulator may use it in-process, where a crash would only end a simulation.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from autoscaler.policy.problems import Problem, line_col

_ERROR_HEAD = re.compile(r"\(error\s+(\d+):")
_ERRORMSG = re.compile(r"\(errormsg (\d+):")
_RULE_HEAD = re.compile(r"^(default\s+)?([a-z_][a-zA-Z0-9_]*)\b(?!\()", re.MULTILINE)
_PACKAGE = re.compile(r"^package\s+([\w.]+)", re.MULTILINE)
# rego-cpp gives no text for some failures; by far the most common is a complete rule
# (or function) that produced two different values for the same input.
NO_MESSAGE = (
    "evaluation error without detail from the engine "
    "(most often conflicting values: a complete rule that produced two different results)"
)
_NOT_RULES = {
    "package",
    "import",
    "default",
    "else",
    "some",
    "every",
    "not",
    "if",
    "contains",
    "true",
    "false",
}


class RegoFailure(Exception):
    """Compilation or evaluation failed; `problems` say where and why."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


@contextmanager
def _quiet_stdout() -> Iterator[None]:
    """rego-cpp prints compile diagnostics with printf; keep them off our stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            yield
        finally:
            os.dup2(saved, 1)
            os.close(saved)


def _length_prefixed(text: str, start: int) -> tuple[str, int]:
    """rego-cpp writes strings as `N:chars`; read one starting at `start` (just after the colon)."""
    m = re.match(r"(\d+):", text[start:])
    if not m:
        return "", start
    n = int(m.group(1))
    begin = start + m.end()
    return text[begin : begin + n], begin + n


def error_messages(blob: str) -> list[str]:
    """Every `(errormsg N:...)` message in a rego-cpp error dump."""
    out = []
    for m in _ERRORMSG.finditer(blob):
        n = int(m.group(1))
        out.append(blob[m.end() : m.end() + n])
    return out


def parse_compile_errors(blob: str, modules: dict[str, str]) -> list[Problem]:
    """Turn `(error 8:file.rego|offset|len (errormsg N:msg) ...)` into file:line problems."""
    problems: list[Problem] = []
    for m in _ERROR_HEAD.finditer(blob):
        name, after = _length_prefixed(blob, m.start(1))
        loc = re.match(r"\|(\d+)\|(\d+)", blob[after:])
        msg_m = _ERRORMSG.search(blob, after)
        message = blob[msg_m.end() : msg_m.end() + int(msg_m.group(1))] if msg_m else "compile error"
        line = col = None
        if loc and name in modules:
            line, col = line_col(modules[name], int(loc.group(1)))
        problems.append(Problem(name or "(policy)", line, message, col))
    if not problems:
        problems.append(Problem("(policy)", None, blob.strip().splitlines()[0] if blob.strip() else "compile error"))
    return problems


def rule_index(modules: dict[str, str]) -> dict[str, tuple[str, int]]:
    """`package/path/rule` -> (file, line) of its first definition, for diagnosis."""
    index: dict[str, tuple[str, int]] = {}
    for rel, source in modules.items():
        pkg = _PACKAGE.search(source)
        if not pkg:
            continue
        prefix = pkg.group(1).replace(".", "/")
        for m in _RULE_HEAD.finditer(source):
            name = m.group(2)
            if name in _NOT_RULES:
                continue
            key = f"{prefix}/{name}"
            if key not in index:
                index[key] = (rel, source.count("\n", 0, m.start()) + 1)
    return index


class RegoRuntime:
    """One compiled policy: modules + data built into a bundle with one entrypoint."""

    def __init__(self) -> None:
        self._interp: Any = None
        self._bundle: Any = None
        self._entrypoint = ""
        self._modules: dict[str, str] = {}
        self._data: dict[str, Any] = {}

    def load(self, modules: dict[str, str], data: dict[str, Any], entrypoint: str) -> None:
        """Compile; raises RegoFailure with file:line problems."""
        from regopy import Interpreter, RegoError

        interp = Interpreter()
        try:
            with _quiet_stdout():
                for rel, source in sorted(modules.items()):
                    interp.add_module(rel, source)
                interp.add_data_json(json.dumps(data))
                bundle = interp.build(None, [entrypoint])
        except RegoError as exc:
            raise RegoFailure(parse_compile_errors(str(exc), modules)) from None
        if not bundle.ok():
            raise RegoFailure([Problem("(policy)", None, f"could not build entrypoint {entrypoint}")])
        # The bundle was checked while it was built; re-checking the engine's internal
        # trees on every query costs ~15 % of an evaluation and finds nothing new.
        interp.well_formed_checks_enabled = False
        self._interp, self._bundle, self._entrypoint = interp, bundle, entrypoint
        self._modules, self._data = dict(modules), data

    def unknown_functions(self, names: list[str]) -> list[str]:
        from regopy import Interpreter

        interp = self._interp or Interpreter()
        return [n for n in names if not interp.is_builtin(n)]

    def _query(self, input_text: str, entrypoint: str, bundle: Any) -> tuple[bool, str]:
        from regopy import rego_shared

        self._interp.set_input_term(input_text)
        # The public Output() would raise JSONDecodeError on an error string; read it raw.
        out = rego_shared.rego_bundle_query_entrypoint(self._interp._impl, bundle._impl, entrypoint)
        try:
            return rego_shared.rego_output_ok(out), rego_shared.rego_output_string(out)
        finally:
            rego_shared.rego_free_output(out)

    def evaluate(self, policy_input: dict[str, Any]) -> tuple[Any, float]:
        """The entrypoint's value (None when undefined) and the evaluation time in ms."""
        return self.evaluate_text(json.dumps(policy_input))

    def evaluate_text(self, input_text: str) -> tuple[Any, float]:
        """`evaluate` for an input already serialised as JSON (what the child receives)."""
        if self._interp is None:
            raise RegoFailure([Problem("(policy)", None, "no policy loaded")])
        started = time.perf_counter()
        ok, text = self._query(input_text, self._entrypoint, self._bundle)
        eval_ms = (time.perf_counter() - started) * 1000
        if ok and text == "undefined":
            return None, eval_ms
        value: Any = None
        if ok and "(error" not in text:
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                ok = False
        else:
            ok = False
        if not ok:
            raise RegoFailure(self.diagnose(input_text, text))
        exprs = value.get("expressions") if isinstance(value, dict) else None
        return (exprs[0] if exprs else None), eval_ms

    def diagnose(self, input_text: str, blob: str) -> list[Problem]:
        """Evaluate each rule alone to find the ones that fail, with file:line."""
        from regopy import Interpreter, RegoError

        problems: list[Problem] = []
        messages = error_messages(blob)
        index = {path: where for path, where in rule_index(self._modules).items() if path != self._entrypoint}
        # One build with every rule as an entrypoint, then one query per rule.
        interp = Interpreter()
        try:
            with _quiet_stdout():
                for name, source in sorted(self._modules.items()):
                    interp.add_module(name, source)
                interp.add_data_json(json.dumps(self._data))
                bundle = interp.build(None, sorted(index))
        except RegoError:
            index, bundle = {}, None
        saved = self._interp
        self._interp = interp
        try:
            for path, (rel, line) in sorted(index.items()):
                ok, text = self._query(input_text, path, bundle)
                if ok and "(error" not in text:
                    continue
                found = error_messages(text) if ok else []
                why = found[0] if found else NO_MESSAGE
                problems.append(Problem(rel, line, f"rule {path.replace('/', '.')} failed: {why}"))
        finally:
            self._interp = saved
        if not problems:
            why = messages[0] if messages else "evaluation failed (no detail from the engine)"
            problems.append(Problem("(policy)", None, f"evaluating {self._entrypoint} failed: {why}"))
        return problems

    def close(self) -> None:
        """Nothing to release: the interpreter goes with this object."""
