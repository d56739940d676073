"""Dashboard login: the token a person pastes is kept in an HttpOnly, SameSite=Strict
cookie and resolved on every page exactly as the API resolves a bearer token.

HttpOnly keeps it away from page scripts; SameSite=Strict means another site cannot
make the browser send it, so the few POST forms need no separate CSRF token. The
cookie is marked Secure when the request arrived over HTTPS (directly or through the
TLS proxy the server insists on for non-loopback addresses).
"""

from __future__ import annotations

from fastapi import Request, Response
from sqlalchemy.orm import Session

from autoscaler.api.context import AppContext
from autoscaler.auth.tokens import Principal, resolve
from autoscaler.errors import Forbidden, Unauthorized

COOKIE = "autoscaler_session"
MAX_AGE_S = 12 * 3600


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


def principal_for_token(request: Request, session: Session, ctx: AppContext, token: str) -> Principal:
    """An admin or team principal for `token`, counting failures like the API does."""
    limiter = request.app.state.limiter
    limiter.check(_client(request))
    try:
        principal, _ = resolve(session, token, ctx.clock.now())
    except Unauthorized:
        limiter.failed(_client(request))
        raise
    if principal.kind not in ("admin", "team") or (principal.kind == "team" and not principal.team):
        raise Forbidden("the dashboard needs an admin or a team token")
    return principal


def cookie_principal(request: Request, session: Session, ctx: AppContext) -> Principal | None:
    """The principal behind the session cookie, or None when absent or no longer valid."""
    token = request.cookies.get(COOKIE)
    if not token or len(token) > 256:
        return None
    try:
        return principal_for_token(request, session, ctx, token)
    except (Unauthorized, Forbidden):
        return None


def _secure(request: Request) -> bool:
    return request.url.scheme == "https" or request.headers.get("x-forwarded-proto") == "https"


def set_session(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        COOKIE, token, max_age=MAX_AGE_S, httponly=True, samesite="strict", secure=_secure(request), path="/"
    )


def clear_session(response: Response, request: Request) -> None:
    response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict", secure=_secure(request))
