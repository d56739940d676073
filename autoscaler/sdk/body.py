"""The JSON body of `POST /api/v1/tasks`, built from typed arguments.

The fields every server knows are always sent. The fields of code-carrying tasks
(`image`, `code`, `setup`, `outputs`, checkpoints, the expected run time) are sent
only when set, so a task
that does not use them enqueues on a server that does not know them yet (such a
server answers 422 for a field it does not know).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoscaler.sdk.models import CodeSource


def task_body(
    command: Sequence[str],
    *,
    queue: str,
    gpus: int = 0,
    nodes: int = 1,
    gpu_type: str | None = None,
    cpus: float = 0,
    memory_mb: int = 0,
    env: Mapping[str, str] | None = None,
    secret_env: Mapping[str, str] | None = None,
    working_dir: str | None = None,
    priority: int = 0,
    max_attempts: int = 3,
    retry_on_exit_codes: Sequence[int] | None = None,
    timeout_s: float | None = None,
    team: str | None = None,
    image: str | None = None,
    image_pull_secret: str | None = None,
    code: CodeSource | None = None,
    setup: str | None = None,
    outputs: Sequence[str] | None = None,
    checkpoint_dir: str | None = None,
    checkpoint_every_s: int | None = None,
    checkpoints: str | None = None,
    expected_runtime_s: float | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "queue": queue,
        "command": list(command),
        "gpus": gpus,
        "nodes": nodes,
        "gpu_type": gpu_type,
        "cpus": cpus,
        "memory_mb": memory_mb,
        "priority": priority,
        "max_attempts": max_attempts,
        "retry_on_exit_codes": None if retry_on_exit_codes is None else list(retry_on_exit_codes),
        "timeout_s": timeout_s,
        "env": dict(env or {}),
        "secret_env": dict(secret_env or {}),
        "working_dir": working_dir,
        "team": team,
    }
    optional: dict[str, Any] = {
        "image": image,
        "image_pull_secret": image_pull_secret,
        "code": None if code is None else code.to_json(),
        "setup": setup,
        "outputs": None if outputs is None else list(outputs),
        "checkpoint_dir": checkpoint_dir,
        "checkpoint_every_s": checkpoint_every_s,
        "checkpoints": checkpoints,
        "expected_runtime_s": expected_runtime_s,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    return body
