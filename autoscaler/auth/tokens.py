"""Bearer tokens, stored as SHA-256 digests only.

Kinds and what they may do:
- admin: everything.
- team: sees, enqueues to and cancels only what its team may.
- join: registers one agent once, in one pool; expires; consumed by its first registration
  (and, when minted for a launch, only for that launch's provider and instance).
- worker: issued at registration; acts only for that worker, and re-registers it
  after an agent restart (which rotates it).

A token's plaintext is shown once, at creation. Tokens carry a kind prefix
(`asa_`, `ast_`, `asj_`, `asw_`) so a leaked one is recognisable in a scan.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.errors import SecurityNote, Unauthorized
from autoscaler.state.models import ApiToken

TokenKind = Literal["admin", "team", "join", "worker"]
PREFIX: dict[str, str] = {"admin": "asa_", "team": "ast_", "join": "asj_", "worker": "asw_"}


@dataclass(frozen=True)
class Principal:
    kind: TokenKind
    token_id: str
    team: str | None = None
    pool: str | None = None
    worker_id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"


def hash_token(plaintext: str) -> str:
    return hashlib.sha256(plaintext.encode()).hexdigest()


def create_token(
    session: Session,
    *,
    kind: TokenKind,
    now: datetime,
    team: str | None = None,
    pool: str | None = None,
    worker_id: str | None = None,
    ttl: timedelta | None = None,
    name: str = "",
    request_id: str | None = None,
    provider: str | None = None,
    max_uses: int = 1,
) -> tuple[str, ApiToken]:
    """Create a token; returns the plaintext (shown once) and the stored row.

    A join token minted for a launch names its `request_id` and `provider`: the
    registration that consumes it must come from that launch."""
    plaintext = PREFIX[kind] + secrets.token_urlsafe(32)
    row = ApiToken(
        kind=kind,
        token_hash=hash_token(plaintext),
        prefix=plaintext[:8],
        name=name,
        team=team,
        pool=pool,
        worker_id=worker_id,
        request_id=request_id,
        provider=provider,
        created_at=now,
        expires_at=now + ttl if ttl else None,
        max_uses=max(max_uses, 1),
        uses=0,
    )
    session.add(row)
    session.flush()
    return plaintext, row


def resolve(session: Session, plaintext: str, now: datetime) -> tuple[Principal, ApiToken]:
    """Map a presented token to its principal, or raise Unauthorized (one message for all causes)."""
    digest = hash_token(plaintext)
    row = session.scalar(select(ApiToken).where(ApiToken.token_hash == digest))
    # The lookup is by digest, so timing reveals nothing about the plaintext; compare
    # anyway in constant time so a future change of lookup cannot introduce a leak.
    if row is None or not hmac.compare_digest(row.token_hash, digest):
        raise Unauthorized(
            "invalid or expired token: check AUTOSCALER_TOKEN or create one with `autoscaler token create`",
            security=SecurityNote(kind="auth_failed", detail="unknown token"),
        )
    if row.revoked or (row.expires_at is not None and row.expires_at <= now):
        raise Unauthorized(
            "invalid or expired token: check AUTOSCALER_TOKEN or create one with `autoscaler token create`",
            security=SecurityNote(
                kind="auth_failed",
                detail=f"{'revoked' if row.revoked else 'expired'} {row.kind} token",
                token_id=row.id,
                token_kind=row.kind,
                pool=row.pool,
                worker_id=row.worker_id,
            ),
        )
    kind: TokenKind = row.kind  # type: ignore[assignment]
    return Principal(kind=kind, token_id=row.id, team=row.team, pool=row.pool, worker_id=row.worker_id), row


class PrincipalCache:
    """Recently resolved tokens, keyed by digest, so that an agent's heartbeat and
    lease polls do not each pay a token SELECT.

    Staleness bound: a token revoked in the database is still accepted for at most
    `ttl_s` seconds by a process that cached it before the revocation. The process
    that revokes (deregistration) forgets the worker's entries at once, so within
    one process revocation is immediate; with `autoscaler server --workers N` the
    other processes follow within `ttl_s`. Expiry is never stale: every hit is checked
    against the token's `expires_at`. Only successful lookups are cached, so a bad
    token always reaches the database and the failure rate limiter.
    """

    def __init__(self, ttl_s: float = 5.0, max_entries: int = 50_000) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[str, tuple[Principal, datetime | None, float]] = {}
        self._lock = threading.Lock()

    def get(self, digest: str, now: datetime) -> Principal | None:
        if self.ttl_s <= 0:
            return None
        with self._lock:
            entry = self._entries.get(digest)
            if entry is None:
                return None
            principal, expires_at, cached_at = entry
            if time.monotonic() - cached_at > self.ttl_s or (expires_at is not None and expires_at <= now):
                del self._entries[digest]
                return None
            return principal

    def put(self, digest: str, principal: Principal, expires_at: datetime | None) -> None:
        if self.ttl_s <= 0:
            return
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()  # rare (more live tokens than entries): start over, stay bounded
            self._entries[digest] = (principal, expires_at, time.monotonic())

    def forget_worker(self, worker_id: str) -> None:
        """Drop a worker's tokens (after deregistration revoked them in the database)."""
        with self._lock:
            for digest in [d for d, (p, _, _) in self._entries.items() if p.worker_id == worker_id]:
                del self._entries[digest]


def resolve_cached(session: Session, plaintext: str, now: datetime, cache: PrincipalCache) -> Principal:
    """`resolve`, answered from `cache` when the digest was resolved within its TTL."""
    digest = hash_token(plaintext)
    hit = cache.get(digest, now)
    if hit is not None:
        return hit
    principal, row = resolve(session, plaintext, now)
    cache.put(digest, principal, row.expires_at)
    return principal
