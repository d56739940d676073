"""Request-scoped helpers: the app context, one transaction per request, and the
checks that turn a bearer token into a principal allowed to do the thing asked."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from autoscaler.api.context import AppContext
from autoscaler.api.ratelimit import AuthFailureLimiter
from autoscaler.auth.tokens import Principal, PrincipalCache, resolve, resolve_cached
from autoscaler.errors import Forbidden, NotFound, SecurityNote, Unauthorized
from autoscaler.state.models import ApiToken


def context_of(request: Request) -> AppContext:
    ctx: AppContext = request.app.state.ctx
    return ctx


async def get_context(request: Request) -> AppContext:
    # `async` only so FastAPI runs it on the event loop: a plain `def` dependency costs
    # a thread-pool round trip on every request, for an attribute read.
    return context_of(request)


Ctx = Annotated[AppContext, Depends(get_context)]


@dataclass
class Credentials:
    """The bearer token presented (not yet checked) and who presented it."""

    token: str | None
    client: str
    limiter: AuthFailureLimiter
    ctx: AppContext
    cache: PrincipalCache

    def _resolve(self, session: Session) -> tuple[Principal, ApiToken]:
        """Uncached: for callers that need the token row itself (registration binds it)."""
        self.limiter.check(self.client)
        if not self.token:
            raise Unauthorized("missing bearer token: pass --token or set AUTOSCALER_TOKEN")
        try:
            return resolve(session, self.token, self.ctx.clock.now())
        except Unauthorized:
            self.limiter.failed(self.client)
            raise

    def principal(self, session: Session) -> Principal:
        """Who presented the token; served from the principal cache when fresh (see PrincipalCache)."""
        self.limiter.check(self.client)
        if not self.token:
            raise Unauthorized("missing bearer token: pass --token or set AUTOSCALER_TOKEN")
        try:
            return resolve_cached(session, self.token, self.ctx.clock.now(), self.cache)
        except Unauthorized:
            self.limiter.failed(self.client)
            raise

    def user(self, session: Session) -> Principal:
        """An admin or a team member."""
        principal = self.principal(session)
        if principal.kind not in ("admin", "team"):
            raise Forbidden(
                f"a {principal.kind} token cannot use this endpoint; use an admin or team token",
                security=_misuse(principal, "used where an admin or team token is needed"),
            )
        return principal

    def admin(self, session: Session) -> Principal:
        principal = self.principal(session)
        if not principal.is_admin:
            raise Forbidden(
                "this endpoint needs an admin token", security=_misuse(principal, "used where an admin token is needed")
            )
        return principal

    def registrant(self, session: Session) -> tuple[Principal, ApiToken]:
        """A join token (first registration) or a worker token (re-registration after an
        agent restart); uncached, because registration consumes or rotates the row."""
        principal, row = self._resolve(session)
        if principal.kind not in ("join", "worker"):
            raise Forbidden(
                "registration needs a join token (`autoscaler token create --join --pool P`), "
                "or the worker's own token to re-register",
                security=_misuse(principal, "used to register a worker"),
            )
        return principal, row

    def worker(self, session: Session, worker_id: str) -> Principal:
        principal = self.principal(session)
        if principal.kind != "worker":
            raise Forbidden(
                "this endpoint is for agents and needs a worker token",
                security=_misuse(principal, "used where a worker token is needed"),
            )
        if principal.worker_id != worker_id:
            # 404, not 403: a worker learns nothing about other workers' ids.
            raise NotFound(
                f"worker {worker_id} is not registered",
                security=_misuse(principal, f"of {principal.worker_id} used for worker {worker_id[:32]}"),
            )
        return principal


def _misuse(principal: Principal, what: str) -> SecurityNote:
    return SecurityNote(
        kind="forbidden",
        detail=f"{principal.kind} token {what}",
        token_id=principal.token_id,
        token_kind=principal.kind,
        pool=principal.pool,
        worker_id=principal.worker_id,
    )


async def get_credentials(request: Request) -> Credentials:
    """The presented token, unchecked (no I/O: async to stay off the thread pool)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    token = value.strip() if scheme.lower() == "bearer" else None
    client = request.client.host if request.client else "unknown"
    return Credentials(
        token=token or None,
        client=client,
        limiter=request.app.state.limiter,
        ctx=context_of(request),
        cache=request.app.state.principals,
    )


Auth = Annotated[Credentials, Depends(get_credentials)]


@contextmanager
def tx(ctx: AppContext) -> Iterator[Session]:
    """One transaction for the whole request: committed before the response is sent."""
    with ctx.sessions() as session, session.begin():
        yield session
