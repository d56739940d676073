"""The embedded Rego interpreters a policy can run on, behind one runtime interface.

`regorus` (the Rust interpreter, default) and `rego-cpp` (PyPI `regopy`, the previous
default, kept selectable with `policy.interpreter: rego-cpp`). Both give the same
decisions on every shipped test case and on generated inputs
(tests/policy/test_engine_differential.py); regorus is about forty times faster on a
large fleet (docs/benchmarks.md).
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

Interpreter = Literal["regorus", "rego-cpp"]
INTERPRETERS: tuple[Interpreter, ...] = ("regorus", "rego-cpp")
DEFAULT_INTERPRETER: Interpreter = "regorus"


class Runtime(Protocol):
    """One compiled policy; every failure is a RegoFailure with file:line problems."""

    def load(self, modules: dict[str, str], data: dict[str, Any], entrypoint: str) -> None: ...

    def evaluate(self, policy_input: dict[str, Any]) -> tuple[Any, float]: ...

    def evaluate_text(self, input_text: str) -> tuple[Any, float]: ...

    def unknown_functions(self, names: list[str]) -> list[str]: ...

    def close(self) -> None: ...


def make_runtime(interpreter: str, *, same_thread: bool = False) -> Runtime:
    """A fresh runtime; raises ValueError naming the choices for an unknown interpreter.

    `same_thread`: only the calling thread will use it (the engine's child process), so
    regorus needs no owner thread (regorus_runtime.py); rego-cpp has none anyway.
    """
    if interpreter == "regorus":
        from autoscaler.policy.regorus_runtime import RegorusRuntime

        return RegorusRuntime(same_thread=same_thread)
    if interpreter == "rego-cpp":
        from autoscaler.policy.rego import RegoRuntime

        return RegoRuntime()
    raise ValueError(f"unknown Rego interpreter {interpreter!r}: use one of {', '.join(INTERPRETERS)}")
