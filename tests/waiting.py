"""One wait for the suite's end-to-end tests: poll a condition until it holds, and on
timeout fail with what the test can say about why (a task's history, a log tail)
instead of sleeping a fixed time or failing with the bare word "timeout"."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout: float = 15.0,
    every: float = 0.05,
    describe: Callable[[], str] | None = None,
) -> Any:
    """`check`'s first truthy value, polled every `every` seconds for up to `timeout`;
    on timeout an AssertionError naming `what`, followed by `describe()`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            said = f"\n{describe()}" if describe is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{said}")
        time.sleep(every)
