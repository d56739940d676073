"""What a task asks for, defined once, and the JSON body of `POST /api/v1/tasks` built from it.

`TaskOptions` names every option `Client.submit` and the CLI's `enqueue` take and
`RemoteOptions` the ones `run_remotely` takes (all but `working_dir` and `code`, which
it sets itself): the signatures are `**options: Unpack[...]` of these, so an option is
added in one place and mypy checks every call against it.

The fields every server knows are always sent (with the defaults below, the server's
own). The fields of code-carrying tasks (`image`, `code`, `setup`, `outputs`,
checkpoints, the expected run time) are sent only when set, so a task that does not
use them enqueues on a server that does not know them yet (such a server answers 422
for a field it does not know).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, Unpack

from autoscaler.sdk.errors import SdkError
from autoscaler.sdk.models import CodeSource


class RemoteOptions(TypedDict, total=False):
    """The options of a task a script sends itself as (docs/sdk.md has each)."""

    gpus: int  # GPUs on each machine; default 0
    nodes: int  # machines it runs on at once, started together (a gang); default 1
    gpu_type: str | None  # words a GPU type must match, e.g. "A100 80GB"
    cpus: float  # per machine; default 0 (any)
    memory_mb: int  # per machine; default 0 (any)
    env: Mapping[str, str] | None  # plain configuration, shown everywhere
    secret_env: Mapping[str, str] | None  # sealed at rest, given only to the worker running it
    priority: int  # higher runs first within the queue; default 0
    max_attempts: int  # failed attempts before it fails for good; default 3
    retry_on_exit_codes: Sequence[int] | None  # retry only these exit codes
    timeout_s: float | None  # seconds before it is stopped
    team: str | None  # admins only: the team it is for
    image: str | None  # run the command in this container image
    image_pull_secret: str | None  # the secret env name holding the registry credential
    setup: str | None  # a shell line run before the command
    outputs: Sequence[str] | None  # paths or globs kept as artifacts after the task
    checkpoint_dir: str | None  # a directory kept across attempts
    checkpoint_every_s: int | None  # how often that directory is saved
    checkpoints: str | None  # what the task survives: none, on-signal, every:MIN
    expected_runtime: str | float | None  # how long it runs, as --expected-runtime takes it: "45m", "6h", or seconds
    expected_runtime_s: float | None  # the same in seconds (one of the two); default: estimated from earlier runs


class TaskOptions(RemoteOptions, total=False):
    """Every option of a task (`Client.submit`, `autoscaler enqueue`)."""

    working_dir: str | None  # absolute directory on the worker; default: a scratch dir of its own
    code: CodeSource | None  # a snapshot or a git checkout the worker fetches


# Sent with every task: the server's defaults, so a body that leaves an option out and
# one that sends its default mean the same.
_ALWAYS_SENT: dict[str, Any] = {
    "gpus": 0,
    "nodes": 1,
    "gpu_type": None,
    "cpus": 0,
    "memory_mb": 0,
    "priority": 0,
    "max_attempts": 3,
    "retry_on_exit_codes": None,
    "timeout_s": None,
    "env": None,
    "secret_env": None,
    "working_dir": None,
    "team": None,
}


# The names, for a check at run time: a TypedDict binds only the type checker.
REMOTE_OPTION_NAMES = frozenset(RemoteOptions.__annotations__)
TASK_OPTION_NAMES = frozenset(TaskOptions.__annotations__)


def check_options(options: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Refuse an option the SDK does not know: a misspelt keyword in a script nobody
    type-checks would otherwise be sent and refused by the server with less to go on."""
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise SdkError(
            f"unknown task option {', '.join(map(repr, unknown))}: the options are "
            f"{', '.join(sorted(allowed))} (docs/sdk.md has each)"
        )


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


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


def _runtime_s(given: dict[str, Any]) -> float | None:
    """The expected run time in seconds from `expected_runtime` or `expected_runtime_s`
    (None: neither, left to the server's estimate); both are taken out of `given`."""
    text, seconds = given.pop("expected_runtime", None), given.pop("expected_runtime_s", None)
    if text is not None and seconds is not None:
        raise SdkError("give expected_runtime (a duration such as '6h') or expected_runtime_s (seconds), not both")
    if text is not None:
        return duration_s(text)
    # Seconds go as given: the server checks them and names the field when it refuses.
    return None if seconds is None else float(seconds)


def task_body(command: Sequence[str], *, queue: str, **options: Unpack[TaskOptions]) -> dict[str, Any]:
    check_options(options, TASK_OPTION_NAMES)
    given: dict[str, Any] = dict(options)
    given["expected_runtime_s"] = _runtime_s(given)
    body: dict[str, Any] = {"queue": queue, "command": list(command)}
    body.update({k: given.pop(k, default) for k, default in _ALWAYS_SENT.items()})
    retry = body["retry_on_exit_codes"]
    body["retry_on_exit_codes"] = None if retry is None else list(retry)
    body["env"] = dict(body["env"] or {})
    body["secret_env"] = dict(body["secret_env"] or {})
    code = given.pop("code", None)
    given["code"] = None if code is None else code.to_json()
    outputs = given.pop("outputs", None)
    given["outputs"] = None if outputs is None else list(outputs)
    body.update({k: v for k, v in given.items() if v is not None})
    _check_finite(body)
    return body


def _check_finite(body: Mapping[str, Any]) -> None:
    """Refuse NaN and infinity before sending: JSON has no such numbers, so the body
    could not be encoded at all (a traceback for the user instead of a refusal)."""
    for name, value in body.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise SdkError(f"{name} {value!r} is not a finite number; give a number such as 1 or 0.5")
