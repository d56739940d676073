"""Map Compute Engine errors to the provider contract's typed errors and their scope.

GCP reports errors in two places: synchronously as an HTTP error whose body carries
`error.errors[].reason` (`quotaExceeded`, `rateLimitExceeded`, `notFound`, ...), and
asynchronously in a zone operation that finishes with `error.errors[].code`
(`ZONE_RESOURCE_POOL_EXHAUSTED`, `QUOTA_EXCEEDED`, ...). Both end up here as
(code, message, quota metric) triples so the mapping is one table.

Scopes follow SkyPilot's failover: a zone out of stock blocks the requested resources
in that zone (the offering: machine type x provisioning model x zone, since spot and
standard capacity run out separately), a regional quota the region, `GPUS_ALL_REGIONS`
the whole provider.
"""

from __future__ import annotations

from collections.abc import Iterable

from providers.base import (
    AuthError,
    CapacityError,
    InvalidRequest,
    NotFound,
    ProviderError,
    QuotaError,
    RateLimited,
    Scope,
    TransientError,
)

CAPACITY_CODES = frozenset(
    {
        "zone_resource_pool_exhausted",
        "zone_resource_pool_exhausted_with_details",
        "insufficientcapacity",
        "insufficient_capacity",
        "resource_pool_exhausted",
    }
)
QUOTA_CODES = frozenset({"quota_exceeded", "quotaexceeded"})
RATE_CODES = frozenset(
    {"resource_operation_rate_exceeded", "ratelimitexceeded", "userratelimitexceeded", "rate_limit_exceeded"}
)
NOT_FOUND_CODES = frozenset({"notfound", "resource_not_found"})
GLOBAL_QUOTAS = ("GPUS_ALL_REGIONS",)


def _norm(code: str) -> str:
    return code.strip().lower()


def map_error(
    codes: Iterable[tuple[str, str, str]],
    *,
    http_status: int | None,
    zone: str,
    fallback_message: str,
) -> ProviderError:
    """Turn GCP's (code or reason, message, quota metric) triples into one typed error.

    The first triple that the table knows decides; unknown codes fall back on the HTTP
    status (429 rate limited, 401/403 auth, 5xx transient, other 4xx invalid).
    """
    entries = list(codes)
    for code, message, metric in entries:
        key = _norm(code)
        text = f"GCP {code} in {zone}: {message}"
        if key in CAPACITY_CODES:
            return CapacityError(text, scope=Scope.OFFERING, code=code)
        if key in QUOTA_CODES:
            is_global = any(q in (metric or message) for q in GLOBAL_QUOTAS)
            return QuotaError(text, scope=Scope.PROVIDER if is_global else Scope.REGION, code=code)
        if key in RATE_CODES:
            return RateLimited(text, retry_after_s=10.0, code=code)
        if key in NOT_FOUND_CODES:
            return NotFound(text, code=code)
    code, message = (entries[0][0], entries[0][1]) if entries else ("", fallback_message)
    text = f"GCP error{f' {code}' if code else ''} in {zone}: {message}"
    if http_status == 429:
        return RateLimited(text, retry_after_s=10.0, code=code or "429")
    if http_status in (401, 403):
        return AuthError(f"{text} (check the service account's roles; see docs/providers.md)", code=code)
    if http_status == 404:
        return NotFound(text, code=code or "notFound")
    if http_status is None or http_status >= 500:
        return TransientError(text, code=code)
    return InvalidRequest(text, code=code)


def from_api_exception(exc: Exception, *, zone: str) -> ProviderError:
    """An exception raised by a google-api-core call (a synchronous HTTP error)."""
    status = getattr(exc, "code", None)
    http_status = int(status) if isinstance(status, int) else None
    triples: list[tuple[str, str, str]] = []
    for err in getattr(exc, "errors", None) or []:
        if isinstance(err, dict):
            triples.append((str(err.get("reason", "")), str(err.get("message", "")), ""))
    message = getattr(exc, "message", None) or str(exc)
    return map_error(triples, http_status=http_status, zone=zone, fallback_message=str(message))
