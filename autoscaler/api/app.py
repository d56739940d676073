"""The FastAPI application: routers, error mapping and request guards.

Errors are always JSON `{"detail": "<message>"}`. Domain errors keep their status;
validation errors are 422 with every offending field named; oversized or too deeply
nested bodies are refused before parsing. Anything unexpected is logged with its
traceback and answered with a 500 that says so, but the suite treats such a 500 as
a bug (schemathesis checks every endpoint for them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException

from autoscaler import __version__
from autoscaler.api.context import AppContext
from autoscaler.api.hostile import NUL_MESSAGE, body_has_nul, target_has_nul
from autoscaler.api.openapi_errors import document_errors
from autoscaler.api.ratelimit import AuthFailureLimiter
from autoscaler.api.routes import fleet, queues, tasks, tokens, workers
from autoscaler.errors import AutoscalerError
from autoscaler.metrics import route as metrics_route
from autoscaler.reports import routes as report_routes
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


def create_app(ctx: AppContext) -> FastAPI:
    app = FastAPI(title="GPU autoscaler", version=__version__, docs_url="/api/docs", redoc_url=None)
    app.state.ctx = ctx
    app.state.limiter = AuthFailureLimiter()

    @app.middleware("http")
    async def guard_body(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if target_has_nul(request.url.path, request.scope.get("query_string", b"")):
            return _error(422, NUL_MESSAGE)
        if request.method in ("POST", "PUT", "PATCH"):
            declared = request.headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY_BYTES):
                return _error(413, f"request body too large; the limit is {MAX_BODY_BYTES} bytes")
            body = await request.body()
            if len(body) > MAX_BODY_BYTES:
                return _error(413, f"request body too large; the limit is {MAX_BODY_BYTES} bytes")
            if json_depth_exceeds(body, MAX_JSON_DEPTH):
                return _error(422, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
            if body_has_nul(body):
                return _error(422, NUL_MESSAGE)
        return await call_next(request)

    @app.exception_handler(AutoscalerError)
    async def domain_error(_request: Request, exc: AutoscalerError) -> JSONResponse:
        return _error(exc.http_status, exc.message)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for e in exc.errors():
            loc = ".".join(str(p) for p in e.get("loc", ()))
            problems.append(f"{loc}: {e.get('msg', 'invalid')}")
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
            return JSONResponse({"detail": "the database is unavailable; retry in a few seconds"},
                                status_code=503, headers={"Retry-After": "2"})
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

    for module in (queues, tasks, workers, fleet, tokens, report_routes, metrics_route, dashboard):
        app.include_router(module.router)
    for hook in ctx.extras.get("routers", []):
        app.include_router(hook)
    document_errors(app)
    return app
