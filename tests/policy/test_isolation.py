"""The engine's child process can crash or hang; the service survives and recovers."""

from __future__ import annotations

import os
import signal
import threading
import time

from autoscaler.policy.bundle import load_bundle
from autoscaler.policy.cases import complete_input
from autoscaler.policy.engines import EmbeddedEngine
from tests.policy.helpers import NOW, SLOW_POLICY


def _engine(tmp_path, timeout_s):
    (tmp_path / "decision.rego").write_text(SLOW_POLICY)
    engine = EmbeddedEngine(load_bundle(tmp_path), timeout_s=timeout_s, isolate=True)
    assert engine.compile() == []
    return engine


FAST = complete_input({"now": NOW})
SLOW = complete_input({"now": NOW, "fleet": {"slow": 1}})


def test_killing_the_child_mid_evaluation_fails_safe_and_the_next_one_works(tmp_path):
    engine = _engine(tmp_path, timeout_s=60)
    try:
        assert engine.evaluate(FAST).decision.warn == ["fast"]
        pid = engine.backend.pid
        results = []
        worker = threading.Thread(target=lambda: results.append(engine.evaluate(SLOW)))
        worker.start()
        time.sleep(0.3)  # the child is now inside rego-cpp
        os.kill(pid, signal.SIGKILL)
        worker.join(timeout=30)
        (crashed,) = results
        assert crashed.decision.fail_safe and "crashed (signal 9)" in crashed.error
        assert crashed.decision.default_team.may_scale_up is False
        after = engine.evaluate(FAST)
        assert after.error is None and after.decision.warn == ["fast"]
        assert engine.backend.pid not in (None, pid) and engine.backend.restarts == 1
    finally:
        engine.close()


def test_a_hung_evaluation_times_out_fails_safe_and_recovers(tmp_path):
    engine = _engine(tmp_path, timeout_s=0.3)
    try:
        engine.evaluate(FAST)
        started = time.monotonic()
        hung = engine.evaluate(SLOW)
        assert time.monotonic() - started < 2.0
        assert hung.decision.fail_safe and "did not answer within 0.3 s" in hung.error
        after = engine.evaluate(FAST)
        assert after.error is None and after.decision.warn == ["fast"]
    finally:
        engine.close()
