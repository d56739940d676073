"""Reports to the server (start, output, finish), delivered in order and kept until
delivered, so a server outage delays them but loses none of them."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass
from typing import Literal

from autoscaler.agent.decisions import cut_uploads
from autoscaler.agent.server_api import ServerApi, ServerRefused
from autoscaler.agent.wire import FinishBody, LogChunk

log = logging.getLogger("autoscaler.agent")
UPLOAD_MAX_CHARS = 192 * 1024  # below the server's 256 KiB per request


@dataclass(frozen=True)
class Report:
    kind: Literal["start", "logs", "finish"]
    task_id: str
    logs: tuple[LogChunk, ...] = ()
    finish: FinishBody | None = None


class Outbox:
    def __init__(self) -> None:
        self._queue: deque[Report] = deque()
        # The server takes a finish's last output in the finish (Registered.finish_with_logs):
        # then a task's last upload and its finish go as one request.
        self.finish_with_logs = False

    def __len__(self) -> int:
        return len(self._queue)

    def started(self, task_id: str) -> None:
        self._queue.append(Report("start", task_id))

    def output(self, task_id: str, chunks: list[LogChunk]) -> None:
        # Output not yet sent for the same task joins it (server away or slow, or the
        # last output queued with the finish): fewer, fuller uploads, same order.
        if self._queue and self._queue[-1].kind == "logs" and self._queue[-1].task_id == task_id:
            chunks = [*self._queue.pop().logs, *chunks]
        for upload in cut_uploads(chunks, UPLOAD_MAX_CHARS):
            self._queue.append(Report("logs", task_id, logs=tuple(upload)))

    def finished(self, task_id: str, body: FinishBody) -> None:
        self._queue.append(Report("finish", task_id, finish=body))

    def deliver(self, api: ServerApi) -> None:
        """Send in order; stops at the first ServerUnreachable, which the caller handles."""
        while self._queue:
            report = self._queue[0]
            try:
                if report.kind == "start":
                    api.start(report.task_id)
                elif report.kind == "logs" and self._ends_with(report):
                    # Its finish follows: one request for both, the output first as before.
                    # (Kept merged in the queue: a retry after an outage sends both again.)
                    self._queue.popleft()
                    finish = self._queue[0].finish
                    assert finish is not None
                    merged = finish.model_copy(update={"logs": [*report.logs, *finish.logs]})
                    self._queue[0] = report = Report("finish", report.task_id, finish=merged)
                    api.finish(report.task_id, merged)
                    log.info("task %s: reported %s", report.task_id, _describe(merged))
                elif report.kind == "logs":
                    api.logs(report.task_id, list(report.logs))
                else:
                    assert report.finish is not None
                    api.finish(report.task_id, report.finish)
                    log.info("task %s: reported %s", report.task_id, _describe(report.finish))
            except ServerRefused as exc:
                # The server has moved on from this task (requeued after a timeout,
                # canceled): nothing to retry, and the heartbeat will stop it if needed.
                log.warning("task %s: server refused %s report (%s); dropping it", report.task_id, report.kind, exc)
            self._queue.popleft()

    def _ends_with(self, report: Report) -> bool:
        """Is `report` (output) directly followed by its task's finish, to be sent with it?"""
        if not self.finish_with_logs or len(self._queue) < 2:
            return False
        after = self._queue[1]
        return after.kind == "finish" and after.task_id == report.task_id and after.finish is not None


def _describe(body: FinishBody) -> str:
    extra = f" ({body.detail})" if body.detail else ""
    return f"{body.reason} exit_code={body.exit_code}{extra}"
