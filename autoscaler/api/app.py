"""The FastAPI application: routers, error mapping and request guards.

Errors are always JSON `{"detail": "<message>"}`. Domain errors keep their status;
validation errors are 422 with every offending field named; oversized or too deeply
nested bodies are refused before parsing. Anything unexpected is logged with its
traceback and answered with a 500 that says so, but the suite treats such a 500 as
a bug (schemathesis checks every endpoint for them).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autoscaler import __version__
from autoscaler.api.context import AppContext
from autoscaler.api.hostile import NUL_MESSAGE, body_has_nul, target_has_nul
from autoscaler.api.longpoll import queued_probe, release_on_signals
from autoscaler.api.openapi_errors import document_errors
from autoscaler.api.ratelimit import AuthFailureLimiter
from autoscaler.api.routes import (
    alerts,
    artifacts,
    fleet,
    metrics,
    policy,
    queues,
    reports,
    spend,
    tasks,
    tokens,
    workers,
)
from autoscaler.api.routes.artifacts import streams_body
from autoscaler.api.schemas import PATTERN_WORDS
from autoscaler.auth import security
from autoscaler.errors import AutoscalerError
from autoscaler.web import pages as dashboard

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 2 * 1024 * 1024
MAX_JSON_DEPTH = 32


def json_depth_exceeds(body: bytes, limit: int) -> bool:
    """True if brackets nest deeper than `limit` (outside strings). Linear, no parsing."""
    depth = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return False


def _error(status: int, message: str, **extra: object) -> JSONResponse:
    return JSONResponse({"detail": message, **extra}, status_code=status)


class BodyGuard:
    """Refuses NULs in the target, oversized, too deeply nested or NUL-carrying bodies
    before routing.

    A pure ASGI middleware rather than `@app.middleware("http")`: Starlette's
    BaseHTTPMiddleware wraps every request in extra tasks and stream objects, which
    cost about a millisecond per request under agent load. The body is read here once
    (at most MAX_BODY_BYTES + 1 bytes) and replayed to the app unchanged.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if target_has_nul(scope.get("path", ""), scope.get("query_string", b"")):
            await _send_error(send, 422, NUL_MESSAGE)
            return
        if scope["method"] not in ("POST", "PUT", "PATCH") or streams_body(scope["method"], scope.get("path", "")):
            # Streamed uploads (snapshots, transfers) are bounded by their routes.
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
            await _send_error(send, 413, f"request body too large; the limit is {MAX_BODY_BYTES} bytes")
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left; nothing to answer
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:  # stop reading: a lying or absent content-length
                await _send_error(send, 413, f"request body too large; the limit is {MAX_BODY_BYTES} bytes")
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if json_depth_exceeds(body, MAX_JSON_DEPTH):
            await _send_error(send, 422, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            return
        if body_has_nul(body):
            await _send_error(send, 422, NUL_MESSAGE)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: only a disconnect can come

        await self.app(scope, replay, send)


async def _send_error(send: Send, status: int, message: str) -> None:
    payload = json.dumps({"detail": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


def _problem(error: Any) -> str:
    """One validation error in words: a pattern the API defines is said as what it asks
    for (`'Vision' is not a name: lowercase letters, ...`), not as its regex."""
    words = PATTERN_WORDS.get(str((error.get("ctx") or {}).get("pattern")))
    if error.get("type") == "string_pattern_mismatch" and words:
        return f"{str(error.get('input'))[:64]!r} is not {words}"
    return str(error.get("msg", "invalid"))


def create_app(ctx: AppContext) -> FastAPI:
    ctx.lease_waiters.attach_probe(queued_probe(ctx.sessions))

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        release_on_signals(ctx.lease_waiters)  # a stop answers open long-polls at once
        yield
        ctx.lease_waiters.close()

    app = FastAPI(title="GPU autoscaler", version=__version__, docs_url="/api/docs", redoc_url=None, lifespan=lifespan)
    app.state.ctx = ctx
    app.state.limiter = AuthFailureLimiter()
    app.state.principals = ctx.principals

    app.add_middleware(BodyGuard)

    @app.exception_handler(AutoscalerError)
    async def domain_error(request: Request, exc: AutoscalerError) -> JSONResponse:
        if exc.security is not None:
            # The request's transaction has rolled back by now: record in one of its own.
            client = request.client.host if request.client else "unknown"
            await run_in_threadpool(
                security.record_note, ctx.sessions, exc.security, now=ctx.clock.now(), client=client
            )
        return _error(exc.http_status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()))
            problems.append(f"{loc}: {_problem(e)}")
        return _error(422, "invalid request: " + "; ".join(problems[:10]))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, str(exc.detail))

    @app.exception_handler(DBAPIError)
    async def database_error(request: Request, exc: DBAPIError) -> JSONResponse:
        # A dropped or refused connection (database restarting, failover, SQLite busy past
        # its timeout) is an outage, not a bug: 503 so clients back off and retry. The
        # pool's pre-ping replaces dead connections, so service resumes by itself.
        if isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated:
            first_line = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
            log.warning("database unavailable during %s %s: %s", request.method, request.url.path, first_line)
            return JSONResponse(
                {"detail": "the database is unavailable; retry in a few seconds"},
                status_code=503,
                headers={"Retry-After": "2"},
            )
        return await unexpected(request, exc)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return _error(500, "internal error; the server log has the details")

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        with ctx.sessions() as s:
            s.execute(text("SELECT 1"))
        return {"status": "ok", "version": __version__}

    # Every router, in every process: an endpoint whose component this process does not
    # run (the policy service under `autoscaler server`) says so itself.
    for module in (
        queues,
        tasks,
        workers,
        artifacts,
        fleet,
        tokens,
        spend,
        reports,
        alerts,
        policy,
        metrics,
        dashboard,
    ):
        app.include_router(module.router)
    document_errors(app)
    return app
