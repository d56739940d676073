"""The task options of the SDK, declared once: `Client.submit`, `run_remotely` and
`task_body` all take them as keyword arguments (`**options: Unpack[TaskOptions]`),
so an option added here reaches all three, with one default and one check each.

Each is the CLI's `enqueue` option of the same name (docs/sdk.md has the table).
`expected_runtime` takes what `--expected-runtime` takes: a duration such as `"45m"`,
`"6h"`, `"90s"`, `"2d"`, or a number of seconds; `expected_runtime_s` is the same in
seconds (give one of the two).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

from autoscaler.sdk.errors import SdkError


class TaskOptions(TypedDict, total=False):
    """Every option of a task but its command, queue, working directory and code."""

    gpus: int
    nodes: int
    gpu_type: str | None
    cpus: float
    memory_mb: int
    env: Mapping[str, str] | None
    secret_env: Mapping[str, str] | None
    priority: int
    max_attempts: int
    retry_on_exit_codes: Sequence[int] | None
    timeout_s: float | None
    team: str | None
    image: str | None
    image_pull_secret: str | None
    setup: str | None
    outputs: Sequence[str] | None
    checkpoint_dir: str | None
    checkpoint_every_s: int | None
    # none | on-signal | every:MIN (the server checks it and says what it accepts).
    checkpoints: str | None
    expected_runtime: str | float | None
    expected_runtime_s: float | None


# The defaults a task gets for an option not given (the server's own defaults).
DEFAULTS: Mapping[str, Any] = {"gpus": 0, "nodes": 1, "cpus": 0, "memory_mb": 0, "priority": 0, "max_attempts": 3}
KNOWN = frozenset(TaskOptions.__annotations__)

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def check_known(options: Mapping[str, Any]) -> None:
    """An SdkError naming an option that is not one (a typo would otherwise be a
    TypeError deep in the SDK)."""
    unknown = sorted(set(options) - KNOWN)
    if unknown:
        raise SdkError(
            f"unknown task option(s) {', '.join(unknown)}; the options are {', '.join(sorted(KNOWN))} (docs/sdk.md)"
        )


def duration_s(value: str | float, *, what: str = "expected_runtime") -> float:
    """Seconds from `"45m"`, `"6h"`, `"90s"`, `"2d"`, `"3600"` or a number; an SdkError
    saying what is accepted otherwise (positive and finite only)."""
    try:
        if isinstance(value, str):
            text = value.strip().lower()
            seconds = float(text[:-1]) * _UNITS[text[-1]] if text and text[-1] in _UNITS else float(text)
        else:
            seconds = float(value)
    except (ValueError, TypeError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise SdkError(f"{what} {value!r} is not a duration; use e.g. 90s, 45m, 6h, 2d or a number of seconds")
    return seconds


def runtime_s(options: Mapping[str, Any]) -> float | None:
    """The expected run time in seconds from `expected_runtime` or `expected_runtime_s`
    (None: neither, left to the server's estimate)."""
    text, seconds = options.get("expected_runtime"), options.get("expected_runtime_s")
    if text is not None and seconds is not None:
        raise SdkError("give expected_runtime (a duration such as '6h') or expected_runtime_s (seconds), not both")
    if text is not None:
        return duration_s(text)
    # Seconds go as given: the server checks them and names the field when it refuses.
    return None if seconds is None else float(seconds)
