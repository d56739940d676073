"""Bearer tokens, stored as SHA-256 digests only.

Kinds and what they may do:
- admin: everything.
- team: sees, enqueues to and cancels only what its team may.
- join: registers one agent in one pool; expires; bound to the first instance that uses it.
- worker: issued at registration; acts only for that worker.

A token's plaintext is shown once, at creation. Tokens carry a kind prefix
(`asa_`, `ast_`, `asj_`, `asw_`) so a leaked one is recognisable in a scan.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.errors import Unauthorized
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
) -> tuple[str, ApiToken]:
    """Create a token; returns the plaintext (shown once) and the stored row."""
    plaintext = PREFIX[kind] + secrets.token_urlsafe(32)
    row = ApiToken(
        kind=kind,
        token_hash=hash_token(plaintext),
        prefix=plaintext[:8],
        name=name,
        team=team,
        pool=pool,
        worker_id=worker_id,
        created_at=now,
        expires_at=now + ttl if ttl else None,
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
            "invalid or expired token: check AUTOSCALER_TOKEN or create one with `autoscaler token create`"
        )
    if row.revoked or (row.expires_at is not None and row.expires_at <= now):
        raise Unauthorized(
            "invalid or expired token: check AUTOSCALER_TOKEN or create one with `autoscaler token create`"
        )
    kind: TokenKind = row.kind  # type: ignore[assignment]
    return Principal(kind=kind, token_id=row.id, team=row.team, pool=row.pool, worker_id=row.worker_id), row
