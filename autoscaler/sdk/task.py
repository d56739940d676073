"""`Task`: a handle on one task by id. Every method is one or a few API calls; nothing
is cached, so each call shows the task as the server sees it now."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

from autoscaler.sdk.errors import SdkError, WaitTimeout
from autoscaler.sdk.models import Artifact, LogChunk, TaskInfo, WhyAnswer
from autoscaler.sdk.transport import Transport, missing_feature

LOG_PAGE = 1000  # the server's default page of log chunks
DOWNLOAD_CHUNK = 1 << 20


class Task:
    def __init__(self, api: Transport, task_id: str, *, sleep: Callable[[float], None] = time.sleep) -> None:
        if not task_id:
            # An empty id would name the task list's URL, whose reply is no task.
            raise SdkError("no task id given: pass the id `autoscaler enqueue` printed (`autoscaler tasks` lists them)")
        self._api = api
        self.id = task_id
        # Quoted: an id is the user's text (a control character must reach the server
        # as a "no such task", not break the URL).
        self._path = "/api/v1/tasks/" + quote(task_id, safe="")
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"Task({self.id!r})"

    def info(self) -> TaskInfo:
        """The task with its history (`events`)."""
        info: TaskInfo = TaskInfo.parse(self._api.get(self._path))
        return info

    def wait(self, timeout: float | None = None, *, poll_s: float = 1.0) -> TaskInfo:
        """Block until the task has succeeded, failed or been canceled, and return it.
        Raises `WaitTimeout` after `timeout` seconds (None: wait for ever). A failed task
        is returned, not raised: look at `state`, `exit_code` and `end_reason`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = self.info()
            if info.done:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"task {self.id} is still {info.state} after {timeout:g}s; wait longer, "
                    f"or ask why with `autoscaler task why {self.id}`"
                )
            left = poll_s if deadline is None else max(0.0, min(poll_s, deadline - time.monotonic()))
            self._sleep(left)

    def _page(self, after: int, rank: int | None = None) -> list[LogChunk]:
        query: dict[str, Any] = {"after": after, "limit": LOG_PAGE}
        if rank is not None:
            query["rank"] = rank
        rows = self._api.get(f"{self._path}/logs", **query)
        return [LogChunk.parse(r) for r in rows]

    def logs(
        self, follow: bool = False, *, after: int = 0, poll_s: float = 1.0, rank: int | None = None
    ) -> Iterator[LogChunk]:
        """The task's output so far, chunk by chunk, stdout and stderr in the order the
        server stored them. `follow=True` keeps waiting for more until the task has
        ended (then yields what came last). `after`: only chunks after this chunk id.
        `rank`: a multi-node task's one rank only (default: every rank's)."""
        while True:
            page = self._page(after, rank)
            for chunk in page:
                after = chunk.id
                yield chunk
            if len(page) == LOG_PAGE:
                continue  # more stored than one page: read on before deciding anything
            if not follow:
                return
            if not page:
                if self.info().done:
                    # The last chunks may have landed between the read and the state check.
                    while page := self._page(after, rank):
                        for chunk in page:
                            after = chunk.id
                            yield chunk
                    return
                self._sleep(poll_s)

    def output(self, stream: str | None = None) -> str:
        """All output stored so far as one string; `stream`: "stdout" or "stderr" only."""
        return "".join(c.data for c in self.logs() if stream in (None, c.stream))

    def cancel(self) -> TaskInfo:
        """Cancel: removed if queued, stopped by its worker if running."""
        info: TaskInfo = TaskInfo.parse(self._api.post(f"{self._path}/cancel"))
        return info

    def why(self) -> WhyAnswer:
        """Why the task is waiting now (or what it is doing if it is not queued)."""
        answer: WhyAnswer = WhyAnswer.parse(self._api.get(f"{self._path}/why"))
        return answer

    def artifacts(self) -> list[Artifact]:
        """The outputs and checkpoints the task left. Raises `FeatureMissing` when the
        server has no artifact store."""
        endpoint = f"{self._path}/artifacts"
        try:
            rows = self._api.get(endpoint)
        except SdkError as exc:
            raise missing_feature(exc, "artifact store", f"GET {endpoint}", self._api.server) from None
        return [Artifact.parse(r) for r in rows]

    def download(self, name: str, dest: str | os.PathLike[str]) -> Path:
        """Download one artifact into directory `dest` (made if missing); returns the
        file's path. The name is the artifact's; a name that would leave `dest` is refused."""
        dest = Path(dest)
        target = (dest / name).resolve()
        if dest.resolve() not in target.parents:
            raise SdkError(f"artifact name {name!r} would be written outside {dest}; refusing")
        endpoint = f"{self._path}/artifacts/{quote(name)}"
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        try:
            with self._api.stream(endpoint) as response, partial.open("wb") as fh:
                for block in response.iter_bytes(DOWNLOAD_CHUNK):
                    fh.write(block)
        except SdkError as exc:
            partial.unlink(missing_ok=True)
            raise missing_feature(exc, "artifact store", f"GET {endpoint}", self._api.server) from None
        partial.replace(target)  # a download cut short never leaves a file that looks whole
        return target
