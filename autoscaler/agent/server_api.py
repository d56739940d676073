"""The agent's HTTP client for the control plane's worker API.

Failures come in two kinds the agent treats differently: `ServerUnreachable`
(connection refused, timeout, 5xx: retry later, keep tasks running) and
`ServerRefused` (4xx: the server understood and said no; retrying the same call
will not help).
"""

from __future__ import annotations

from typing import Any

import httpx

from autoscaler import __version__
from autoscaler.agent.wire import (
    Commands,
    FinishBody,
    HeartbeatBody,
    LeasedTask,
    LeaseReply,
    LogChunk,
    RegisterBody,
    Registered,
)

API = "/api/v1/workers"


class ServerUnreachable(Exception):
    """The server did not answer or answered 5xx: try again later."""


class ServerRefused(Exception):
    """The server answered 4xx; `status` and `detail` say why."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"{status}: {detail}")
        self.status = status
        self.detail = detail


class ServerApi:
    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=base_url, timeout=timeout_s, headers={"User-Agent": f"autoscaler-agent/{__version__}"}
        )
        self.worker_id: str | None = None
        self._token: str | None = None
        self.gang_reserved = False  # the last lease: a rank of a forming gang waits here
        self.lease_commands: Commands | None = None  # the last lease: its heartbeat's reply

    def close(self) -> None:
        self._http.close()

    def _call(self, path: str, body: Any, token: str | None = None, *, timeout_s: float | None = None) -> Any:
        headers = {"Authorization": f"Bearer {token or self._token}"}
        try:
            r = self._http.post(path, json=body, headers=headers, timeout=timeout_s or self.timeout_s)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(f"{exc.__class__.__name__}: {exc}") from None
        if r.status_code >= 500:
            raise ServerUnreachable(f"server answered {r.status_code}")
        if r.status_code >= 400:
            try:
                detail = str(r.json().get("detail", r.text))
            except ValueError:
                detail = r.text
            raise ServerRefused(r.status_code, detail[:500])
        return r.json() if r.content else None

    def _worker(self, suffix: str) -> str:
        assert self.worker_id is not None, "register first"
        return f"{API}/{self.worker_id}/{suffix}"

    def register(self, join_token: str, body: RegisterBody) -> Registered:
        reply = Registered.model_validate(self._call(f"{API}/register", body.model_dump(), token=join_token))
        self.worker_id = reply.worker_id
        self._token = reply.worker_token
        return reply

    def heartbeat(self, body: HeartbeatBody) -> Commands:
        return Commands.model_validate(self._call(self._worker("heartbeat"), body.model_dump(mode="json")))

    def lease(self, wait_s: float = 0.0, heartbeat: HeartbeatBody | None = None) -> LeasedTask | None:
        """A task, or None. With `wait_s`, the server may hold the request that long
        for work to appear (long-poll); the call's timeout grows by as much. With
        `heartbeat`, the request is this interval's heartbeat too: the server's reply
        to it is then in `lease_commands` (None there: the heartbeat was not recorded)."""
        body = {"heartbeat": heartbeat.model_dump(mode="json")} if heartbeat is not None else {}
        if wait_s <= 0:
            reply = LeaseReply.model_validate(self._call(self._worker("lease"), body))
        else:
            path = f"{self._worker('lease')}?wait_s={wait_s:.3f}"
            reply = LeaseReply.model_validate(self._call(path, body, timeout_s=self.timeout_s + wait_s))
        # Kept for the loop: a rank of a forming gang waits here, so poll again soon.
        self.gang_reserved = reply.reserved
        self.lease_commands = reply.heartbeat
        return reply.task

    def start(self, task_id: str) -> None:
        self._call(self._worker(f"tasks/{task_id}/start"), {})

    def finish(self, task_id: str, body: FinishBody) -> None:
        # No `logs` key unless there are some: a server before FinishIn.logs refuses it.
        self._call(self._worker(f"tasks/{task_id}/finish"), body.model_dump(exclude=None if body.logs else {"logs"}))

    def logs(self, task_id: str, chunks: list[LogChunk]) -> None:
        self._call(self._worker(f"tasks/{task_id}/logs"), {"chunks": [c.model_dump() for c in chunks]})

    def deregister(self) -> None:
        self._call(self._worker("deregister"), {})
