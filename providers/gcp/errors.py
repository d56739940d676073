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


def map_error(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """One GCP error (code or reason, message, HTTP status) -> a typed error.

    Known codes decide; unknown ones fall back on the HTTP status (429 rate limited,
    401/403 auth, 404 not found, 5xx or none transient, other 4xx invalid)."""
    key = _norm(code)
    if key in CAPACITY_CODES:
        return CapacityError(message, scope=Scope.OFFERING, code=code)
    if key in QUOTA_CODES:
        is_global = any(q in message for q in GLOBAL_QUOTAS)
        return QuotaError(message, scope=Scope.PROVIDER if is_global else Scope.REGION, code=code)
    if key in RATE_CODES or http_status == 429:
        return RateLimited(message, retry_after_s=10.0, code=code or "429")
    if key in NOT_FOUND_CODES or http_status == 404:
        return NotFound(message, code=code or "notFound")
    if http_status in (401, 403):
        return AuthError(f"{message} (check the service account's roles; see docs/providers.md)", code=code)
    if http_status is None or http_status >= 500:
        return TransientError(message, code=code)
    return InvalidRequest(message, code=code)


def _known(code: str) -> bool:
    return _norm(code) in CAPACITY_CODES | QUOTA_CODES | RATE_CODES | NOT_FOUND_CODES


def from_errors(
    errors: Iterable[tuple[str, str, str]], *, http_status: int | None, zone: str, fallback_message: str
) -> ProviderError:
    """GCP's list of (code or reason, message, quota metric) for one failure -> one typed
    error: the first entry whose code is known decides, else the first entry."""
    entries = list(errors)
    chosen = next((e for e in entries if _known(e[0])), entries[0] if entries else ("", fallback_message, ""))
    code, message, metric = chosen
    if metric and metric not in message:
        message = f"{message} ({metric})"
    text = f"GCP {code} in {zone}: {message}" if code else f"GCP error in {zone}: {message}"
    return map_error(code, text, http_status)


def from_api_exception(exc: Exception, *, zone: str) -> ProviderError:
    """An exception raised by a google-api-core call (a synchronous HTTP error)."""
    status = getattr(exc, "code", None)
    http_status = int(status) if isinstance(status, int) else None
    triples: list[tuple[str, str, str]] = []
    for err in getattr(exc, "errors", None) or []:
        if isinstance(err, dict):
            triples.append((str(err.get("reason", "")), str(err.get("message", "")), ""))
    message = getattr(exc, "message", None) or str(exc)
    return from_errors(triples, http_status=http_status, zone=zone, fallback_message=str(message))
