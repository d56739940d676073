"""A tiny threaded HTTP server for the cloud REST fakes (GCP, Azure).

Each fake is a werkzeug WSGI app; this runs it on 127.0.0.1 with a free port, records
every request (method, path, query, JSON body) and stops cleanly. Started once per test
session by the fixtures, so its cost is paid once.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: Any
    headers: dict[str, str] = field(default_factory=dict)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(payload), status=status, headers=headers or {}, content_type="application/json")


class _QuietHandler(WSGIRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        pass  # the fakes record requests themselves; access logs would flood test output


class RestFake:
    """Base: subclasses implement `handle(request, body) -> Response` under a lock."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.requests: list[RecordedRequest] = []
        self._server: BaseWSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the fake first"
        return f"http://127.0.0.1:{self._server.server_port}"

    def start(self) -> RestFake:
        self._server = make_server("127.0.0.1", 0, self._wsgi, threaded=True, request_handler=_QuietHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def requests_matching(self, method: str, path_part: str) -> list[RecordedRequest]:
        with self.lock:
            return [r for r in self.requests if r.method == method and path_part in r.path]

    def handle(self, request: Request, body: Any) -> Response:  # pragma: no cover - abstract
        raise NotImplementedError

    def _wsgi(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        request = Request(environ)
        raw = request.get_data()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode(errors="replace")
        with self.lock:
            self.requests.append(
                RecordedRequest(
                    request.method,
                    request.path,
                    dict(request.args),
                    body,
                    {k.lower(): v for k, v in request.headers.items()},
                )
            )
            response = self.handle(request, body)
        return response(environ, start_response)
