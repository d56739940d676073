"""How the regorus runtime owns its engines (a regorus Engine is bound to its thread).

Calls from the thread that made the runtime run there, on that thread's engine; calls
from any other thread go to one owner thread (the service in-process: request threads
and the reconcile thread). Every engine answers the last good load. `same_thread` (the
engine's child process) refuses calls from other threads with a message rather than
touching an engine. No engine is ever dropped on a thread other than its own.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from autoscaler.policy.rego import RegoFailure
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
    runtime = _load(RegorusRuntime(same_thread=same_thread))
    try:
        with pytest.raises(RegoFailure):
            runtime.evaluate_text('{"n": "text"}')
        assert runtime.evaluate_text('{"n": 3}')[0] == {"double": 6}
    finally:
        runtime.close()


def _policy(factor: int) -> dict[str, str]:
    return {"p.rego": f'package p\nimport rego.v1\nanswer := {{"double": {factor} * input.n}}\n'}


def _owner_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "regorus")


def test_the_making_thread_evaluates_on_its_own_engine_and_only_others_start_the_owner():
    before = _owner_threads()
    runtime = _load(RegorusRuntime())
    try:
        for n in range(50):
            assert runtime.evaluate_text(f'{{"n": {n}}}')[0] == {"double": 2 * n}
        assert _owner_threads() == before  # no hand-off for the thread that made it
        with ThreadPoolExecutor(max_workers=2) as pool:
            assert pool.submit(runtime.evaluate_text, '{"n": 5}').result()[0] == {"double": 10}
        assert _owner_threads() == before + 1
    finally:
        runtime.close()


def test_a_reload_from_any_thread_reaches_every_engine_and_a_bad_one_reaches_none():
    runtime = _load(RegorusRuntime())
    pool = ThreadPoolExecutor(max_workers=3)

    def everywhere(n: int) -> list[Any]:
        """The answer on the making thread and on three others (the owner's engine)."""
        others = [pool.submit(runtime.evaluate_text, f'{{"n": {n}}}') for _ in range(3)]
        return [runtime.evaluate_text(f'{{"n": {n}}}')[0], *(f.result()[0] for f in others)]

    try:
        assert everywhere(1) == [{"double": 2}] * 4
        runtime.load(_policy(3), {}, "p/answer")
        assert everywhere(1) == [{"double": 3}] * 4
        with pytest.raises(RegoFailure):
            runtime.load({"p.rego": "package p\nanswer := {"}, {}, "p/answer")
        assert everywhere(1) == [{"double": 3}] * 4  # the last good load stays, on both engines
        pool.submit(runtime.load, _policy(5), {}, "p/answer").result()  # loaded on the owner
        assert everywhere(1) == [{"double": 5}] * 4
    finally:
        pool.shutdown()
        runtime.close()


def test_reloads_racing_evaluations_on_many_threads_answer_one_whole_policy_each():
    runtime = _load(RegorusRuntime())
    stop = threading.Event()
    seen: list[Any] = []
    errors: list[BaseException] = []

    def ask() -> None:
        while not stop.is_set():
            try:
                seen.append(runtime.evaluate_text('{"n": 1}')[0])
            except BaseException as exc:  # recorded: the assertion below says what
                errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for i in range(30):
            runtime.load(_policy(3 if i % 2 else 2), {}, "p/answer")
            seen.append(runtime.evaluate_text('{"n": 1}')[0])
        runtime.load(_policy(7), {}, "p/answer")
        stop.set()
        for t in threads:
            t.join()
        assert errors == []
        assert {a["double"] for a in seen} <= {2, 3, 7} and len(seen) > 30
        # Once a load has returned, no thread's next call answers an older policy.
        with ThreadPoolExecutor(max_workers=4) as pool:
            assert list(pool.map(lambda _: runtime.evaluate_text('{"n": 1}')[0], range(8))) == [{"double": 7}] * 8
        assert runtime.evaluate_text('{"n": 1}')[0] == {"double": 7}
    finally:
        stop.set()
        runtime.close()


@pytest.fixture
def thread_errors() -> Iterator[list[str]]:
    """What threads and finalizers raised (an engine dropped off its thread raises there)."""
    caught: list[str] = []
    old_thread, old_unraisable = threading.excepthook, sys.unraisablehook
    threading.excepthook = lambda args: caught.append(repr(args.exc_value))
    sys.unraisablehook = lambda args: caught.append(repr(args.exc_value))
    try:
        yield caught
    finally:
        threading.excepthook, sys.unraisablehook = old_thread, old_unraisable


def _on_a_thread(fn: Any) -> None:
    thread = threading.Thread(target=fn)
    thread.start()
    thread.join()


def test_no_engine_is_dropped_on_a_thread_other_than_its_own(thread_errors: list[str]) -> None:
    # Made, loaded and used on the main thread, then let go on another.
    box = [_load(RegorusRuntime())]
    assert box[0].evaluate_text('{"n": 1}')[0] == {"double": 2}
    _on_a_thread(lambda: (box.clear(), gc.collect()))
    # Made on a thread that ends while the runtime lives on; used from here (the owner).
    made: list[RegorusRuntime] = []
    _on_a_thread(lambda: made.append(_load(RegorusRuntime())) or made[0].evaluate_text('{"n": 2}'))
    assert made[0].evaluate_text('{"n": 3}')[0] == {"double": 6}
    _on_a_thread(lambda: (made.clear(), gc.collect()))
    # The main thread's next call drops the first runtime's engine here, on its thread.
    other = _load(RegorusRuntime())
    assert other.evaluate_text('{"n": 4}')[0] == {"double": 8}
    other.close()
    gc.collect()
    assert thread_errors == []
