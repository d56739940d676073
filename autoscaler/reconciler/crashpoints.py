"""Named points where the control plane can be made to die, for crash-safety tests.

`crash_point("after_intent")` kills this process with SIGKILL (no cleanup, no
finally blocks: what a power cut or the OOM killer does) when the environment says
`AUTOSCALER_CRASH_AT=after_intent`. `AUTOSCALER_CRASH_SKIP=n` passes the point n
times first, so a test can vary where in a run it dies. Unset, a point costs one
dictionary lookup. The points sit between the steps whose order makes a launch or
a termination safe (intent committed -> call submitted -> provider called -> outcome
queued -> outcome recorded).
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_sync_commit",  # passive sync recorded, notices not acknowledged, re-terminations not sent
    "after_intent",  # launch intent committed, provider not called yet
    "before_launch_submit",  # intent moved to launching (user-data token made), call not submitted
    "after_provider_call",  # provider launched (in an executor thread), outcome not queued
    "before_apply_outcome",  # outcomes queued by the executor, not recorded yet
    "after_terminate_intent",  # instance marked terminating, provider not called yet
    "after_terminate_call",  # provider terminated, outcome not recorded
    "after_drain",  # worker drain committed
    "before_record",  # cycle acted, decision not recorded
)
_passed: dict[str, int] = {}


def crash_point(name: str) -> None:
    if os.environ.get("AUTOSCALER_CRASH_AT") != name:
        return
    _passed[name] = _passed.get(name, 0) + 1
    if _passed[name] > int(os.environ.get("AUTOSCALER_CRASH_SKIP", "0")):
        os.kill(os.getpid(), signal.SIGKILL)
