"""`Client`: the entry point of the SDK. Holds the server URL and token and makes
`Task` handles; the CLI's client commands go through it too."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Unpack
from urllib.parse import quote

from autoscaler.sdk.body import TaskOptions, task_body
from autoscaler.sdk.errors import SdkError
from autoscaler.sdk.models import Snapshot, TaskInfo
from autoscaler.sdk.settings import resolve_server, resolve_token
from autoscaler.sdk.task import Task
from autoscaler.sdk.transport import Transport, missing_feature


class Client:
    """`Client()` finds the server and token as the CLI does (arguments, then
    AUTOSCALER_SERVER / AUTOSCALER_TOKEN, then `server.url` / `admin.token` in
    AUTOSCALER_HOME); pass them to override. Usable as a context manager."""

    def __init__(
        self,
        server: str | None = None,
        token: str | None = None,
        *,
        home: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        home = None if home is None else Path(home)  # a script passes a string as often as a Path
        self.server = resolve_server(server, home)
        # The raw JSON layer: for endpoints the SDK has no method for (the CLI's admin views).
        self.api = Transport(self.server, resolve_token(token, home), timeout=timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self.api.close()

    def submit_raw(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Enqueue from a ready body (see `autoscaler.sdk.body.task_body`); the reply as sent."""
        reply: dict[str, Any] = self.api.post("/api/v1/tasks", dict(body))
        return reply

    def submit(self, command: Sequence[str], *, queue: str, **options: Unpack[TaskOptions]) -> Task:
        """Enqueue `command` (argv, no shell) and return its handle. The options
        (`TaskOptions`) are the CLI's `enqueue` options; see docs/sdk.md for each."""
        if isinstance(command, str):
            # A string would be sent as one argv entry per character.
            raise SdkError(f"command must be a list of arguments, e.g. {command.split()!r}, not a string")
        body = task_body(command, queue=queue, **options)
        return self.task(self.submit_raw(body)["id"])

    def task(self, task_id: str) -> Task:
        """A handle on an existing task (no request is made until a method is called)."""
        return Task(self.api, task_id)

    def tasks(
        self,
        *,
        queue: str | None = None,
        state: str | Sequence[str] | None = None,
        team: str | None = None,
        limit: int = 100,
    ) -> list[TaskInfo]:
        """Tasks, newest first (a team token sees its own team's only); `state` is one
        state or a list of them."""
        states = [state] if isinstance(state, str) else list(state or [])  # not one state per character
        rows = self.api.get("/api/v1/tasks", queue=queue, state=states or None, team=team, limit=limit)
        return [TaskInfo.parse(r) for r in rows]

    def upload_snapshot(self, archive: Path, *, team: str | None = None) -> Snapshot:
        """Store a tar.gz of code on the server; the returned digest goes in
        `submit(code=SnapshotCode(digest))` (for the same team: admins name it, a team
        token's snapshot is its team's). Raises `FeatureMissing` when the server has no
        snapshot store."""
        endpoint = "/api/v1/snapshots" + (f"?team={quote(team)}" if team else "")
        try:
            reply = self.api.post_file(endpoint, archive, "application/gzip")
        except SdkError as exc:
            raise missing_feature(exc, "snapshot store", f"POST {endpoint}", self.server) from None
        snapshot: Snapshot = Snapshot.parse(reply)
        return snapshot
