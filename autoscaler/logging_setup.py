"""Structured JSON logs (opt-in): one JSON object per line with the time, level,
logger, message and the ids that tie a line to the system's objects.

Turn on with `AUTOSCALER_LOG_FORMAT=json` (or `configure_logging(json_format=True)`).
Ids come from `extra={"task_id": ...}` on a log call, or from `log_context(...)`
for a whole block (a reconcile cycle, one request), which works across threads
started inside the block only if they copy the context (contextvars semantics).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

ID_FIELDS = ("task_id", "worker_id", "instance_id", "decision_id", "team", "queue", "pool", "request_id")
_context: ContextVar[dict[str, Any]] = ContextVar("autoscaler_log_context", default={})  # noqa: B039


@contextmanager
def log_context(**ids: Any) -> Iterator[None]:
    """Attach ids to every log line written inside the block."""
    token = _context.set({**_context.get(), **{k: v for k, v in ids.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        doc.update(_context.get())
        for name in ID_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                doc[name] = value
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str, ensure_ascii=False)


def json_wanted() -> bool:
    return os.environ.get("AUTOSCALER_LOG_FORMAT", "").strip().lower() == "json"


def configure_logging(*, json_format: bool | None = None, level: int | str = logging.INFO) -> None:
    """Set up the root logger: JSON lines when asked (flag or env), else the plain format."""
    use_json = json_wanted() if json_format is None else json_format
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if use_json else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
