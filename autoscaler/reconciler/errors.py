"""What a provider error means for the next cycle: which scope to mark unavailable, for how
long, and how the pool backs off. Pure, so the rules are tested as a table."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from providers.base import (
    AuthError,
    CapacityError,
    InvalidRequest,
    Offering,
    ProviderError,
    QuotaError,
    RateLimited,
    Scope,
)

BACKOFF_BASE_S = 5.0
BACKOFF_MAX_S = 300.0


@dataclass(frozen=True)
class Block:
    """An `OfferingBlock` to write: (scope, key) unavailable until `until`."""

    scope: str
    key: str
    until: datetime


def block_for(
    error: ProviderError, offering: Offering, *, region: str | None, now: datetime, ttl_s: float
) -> Block | None:
    """Capacity and quota errors block their scope for the TTL so the next plan falls back to
    another zone, type, capacity type or provider; auth and invalid requests block too (they
    will not heal by retrying); throttling and transient errors block nothing."""
    if isinstance(error, RateLimited) or error.retryable:
        return None
    if not isinstance(error, CapacityError | QuotaError | AuthError | InvalidRequest):
        return None
    until = now + timedelta(seconds=ttl_s)
    scope = error.scope
    if scope == Scope.OFFERING:
        return Block("offering", offering.key, until)
    if scope == Scope.ZONE:
        return Block("zone", offering.zone or "-", until)
    if scope == Scope.REGION:
        return Block("region", region or offering.region or "-", until)
    return Block("provider", "*", until)


def backoff_delay(consecutive_failures: int, *, retry_after_s: float = 0.0) -> float:
    """Exponential per-pool backoff: 5 s, 10 s, 20 s ... capped at 5 min (Cluster Autoscaler's
    habit, shorter: the offering blocks already steer the next plan elsewhere)."""
    if consecutive_failures <= 0:
        return 0.0
    delay = min(BACKOFF_BASE_S * 2.0 ** (consecutive_failures - 1), BACKOFF_MAX_S)
    return max(delay, retry_after_s)
