"""The Python SDK: submit tasks, follow them and fetch what they left, from Python.

    from autoscaler.sdk import Client

    with Client() as client:  # server and token as the CLI finds them
        task = client.submit(["python", "train.py"], queue="gpu", gpus=1)
        info = task.wait(timeout=3600)
        print(info.state, task.output())

`run_remotely(queue=..., gpus=...)` at the top of a script sends the script itself.
Reference: docs/sdk.md.
"""

from __future__ import annotations

from autoscaler.sdk.client import Client
from autoscaler.sdk.errors import (
    AuthError,
    FeatureMissing,
    NotAScript,
    NotFoundError,
    Rejected,
    SdkError,
    ServerError,
    ServerUnreachable,
    WaitTimeout,
)
from autoscaler.sdk.models import (
    Artifact,
    CodeSource,
    GitCode,
    LogChunk,
    Snapshot,
    SnapshotCode,
    TaskEvent,
    TaskInfo,
    WhyAnswer,
)
from autoscaler.sdk.remote import on_worker, run_remotely
from autoscaler.sdk.task import Task

__all__ = [
    "Artifact",
    "AuthError",
    "Client",
    "CodeSource",
    "FeatureMissing",
    "GitCode",
    "LogChunk",
    "NotAScript",
    "NotFoundError",
    "Rejected",
    "SdkError",
    "ServerError",
    "ServerUnreachable",
    "Snapshot",
    "SnapshotCode",
    "Task",
    "TaskEvent",
    "TaskInfo",
    "WaitTimeout",
    "WhyAnswer",
    "on_worker",
    "run_remotely",
]
