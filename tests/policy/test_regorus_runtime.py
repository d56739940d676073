"""The regorus runtime's two ways of owning its engine (a regorus Engine is bound to its thread).

The default hands every call to one owner thread, so any thread may call it (the
service in-process: request threads and the reconcile thread). `same_thread` runs calls
on the thread that made it, without the hop; the engine's child process uses it, and a
call from any other thread is refused with a message rather than touching the engine.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from autoscaler.policy.regorus_runtime import RegorusRuntime

MODULES = {"p.rego": 'package p\nimport rego.v1\nanswer := {"double": 2 * input.n}\n'}


def _load(runtime: RegorusRuntime) -> RegorusRuntime:
    runtime.load(MODULES, {}, "p/answer")
    return runtime


def test_a_same_thread_runtime_answers_on_its_thread_and_refuses_others():
    runtime = _load(RegorusRuntime(same_thread=True))
    try:
        assert runtime.evaluate_text('{"n": 21}')[0] == {"double": 42}
        refused: list[BaseException] = []

        def other() -> None:
            try:
                runtime.evaluate_text('{"n": 1}')
            except RuntimeError as exc:
                refused.append(exc)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert len(refused) == 1 and "from another thread" in str(refused[0])
        # The refusal left the engine as it was.
        assert runtime.evaluate_text('{"n": 2}')[0] == {"double": 4}
    finally:
        runtime.close()


def test_the_default_runtime_serves_every_thread_in_turn():
    runtime = _load(RegorusRuntime())
    try:

        def ask(n: int) -> Any:
            return runtime.evaluate_text(f'{{"n": {n}}}')[0]

        with ThreadPoolExecutor(max_workers=4) as pool:
            answers = list(pool.map(ask, range(40)))
        assert answers == [{"double": 2 * n} for n in range(40)]
    finally:
        runtime.close()


@pytest.mark.parametrize("same_thread", [False, True])
def test_a_broken_input_is_a_rego_failure_either_way(same_thread):
    from autoscaler.policy.rego import RegoFailure

    runtime = _load(RegorusRuntime(same_thread=same_thread))
    try:
        with pytest.raises(RegoFailure):
            runtime.evaluate_text('{"n": "text"}')
        assert runtime.evaluate_text('{"n": 3}')[0] == {"double": 6}
    finally:
        runtime.close()
