"""The JSON body of `POST /api/v1/tasks`, built from typed arguments.

The fields every server knows are always sent. The fields of code-carrying tasks
(`image`, `code`, `setup`, `outputs`, checkpoints, the expected run time) are sent
only when set, so a task
that does not use them enqueues on a server that does not know them yet (such a
server answers 422 for a field it does not know).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Unpack

from autoscaler.sdk.models import CodeSource
from autoscaler.sdk.options import DEFAULTS, TaskOptions, check_known, runtime_s


def task_body(
    command: Sequence[str],
    *,
    queue: str,
    working_dir: str | None = None,
    code: CodeSource | None = None,
    **options: Unpack[TaskOptions],
) -> dict[str, Any]:
    """The body for `command` in `queue`; `options` are `TaskOptions` (autoscaler.sdk.options)."""
    check_known(options)
    o: dict[str, Any] = {**DEFAULTS, **options}
    codes = o.get("retry_on_exit_codes")
    body: dict[str, Any] = {
        "queue": queue,
        "command": list(command),
        "gpus": o["gpus"],
        "nodes": o["nodes"],
        "gpu_type": o.get("gpu_type"),
        "cpus": o["cpus"],
        "memory_mb": o["memory_mb"],
        "priority": o["priority"],
        "max_attempts": o["max_attempts"],
        "retry_on_exit_codes": None if codes is None else list(codes),
        "timeout_s": o.get("timeout_s"),
        "env": dict(o.get("env") or {}),
        "secret_env": dict(o.get("secret_env") or {}),
        "working_dir": working_dir,
        "team": o.get("team"),
    }
    outputs = o.get("outputs")
    optional: dict[str, Any] = {
        "image": o.get("image"),
        "image_pull_secret": o.get("image_pull_secret"),
        "code": None if code is None else code.to_json(),
        "setup": o.get("setup"),
        "outputs": None if outputs is None else list(outputs),
        "checkpoint_dir": o.get("checkpoint_dir"),
        "checkpoint_every_s": o.get("checkpoint_every_s"),
        "checkpoints": o.get("checkpoints"),
        "expected_runtime_s": runtime_s(o),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body
