"""Map Azure Resource Manager errors to the provider contract's typed errors and scope.

ARM reports an error code either in the PUT's HTTP answer or in the failed
long-running operation (`{"status": "Failed", "error": {"code", "message"}}`); azure-core
raises both as `HttpResponseError` whose `.error.code` carries it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

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

# Allocation failures: this VM size (and priority) has no room in that zone now; other
# sizes, zones or Regular instead of Spot may still be allocated.
_CAPACITY = {
    "AllocationFailed": Scope.OFFERING,
    "OverconstrainedAllocationRequest": Scope.OFFERING,
    "OverconstrainedZonalAllocationRequest": Scope.OFFERING,
    "ZonalAllocationFailed": Scope.OFFERING,
}
_QUOTA_TEXT = re.compile(r"quota|exceeding approved|cores? limit", re.IGNORECASE)
_NOT_FOUND = {"ResourceNotFound", "NotFound", "ResourceGroupNotFound"}
_AUTH = {
    "AuthorizationFailed",
    "AuthenticationFailed",
    "InvalidAuthenticationToken",
    "LinkedAuthorizationFailed",
}


def map_error(code: str, message: str, http_status: int | None = None, *, retry_after_s: float = 10.0) -> ProviderError:
    """One ARM error (code, message, HTTP status) -> a typed error; `retry_after_s` is
    the answer's Retry-After, for a throttled call."""
    if code in _CAPACITY:
        return CapacityError(message, scope=_CAPACITY[code], code=code)
    if code == "SkuNotAvailable":
        # The size is not offered in this region/zone for this subscription (or as spot):
        # no point retrying this offering; other sizes or regions may work.
        return CapacityError(message, scope=Scope.OFFERING, code=code)
    if code in ("QuotaExceeded", "OperationNotAllowed") and (code == "QuotaExceeded" or _QUOTA_TEXT.search(message)):
        # Azure vCPU quotas are per region and VM family (and one for all spot VMs).
        return QuotaError(message, scope=Scope.REGION, code=code)
    if http_status == 429 or code in ("TooManyRequests", "OperationPreempted"):
        return RateLimited(message, retry_after_s=retry_after_s, code=code or "429")
    if code in _NOT_FOUND or http_status == 404:
        return NotFound(message, code=code)
    if code in _AUTH or http_status in (401, 403):
        return AuthError(f"{message} (check the identity's role assignments; see docs/providers.md)", code=code)
    if http_status is None or http_status >= 500:
        return TransientError(message, code=code)
    return InvalidRequest(message, code=code)


def from_http_error(exc: Exception, *, where: str) -> ProviderError:
    """An azure-core `HttpResponseError` (synchronous answer or failed operation)."""
    error = getattr(exc, "error", None)
    code = str(getattr(error, "code", "") or "")
    message = str(getattr(error, "message", "") or getattr(exc, "message", "") or exc)
    response = getattr(exc, "response", None)
    status = getattr(exc, "status_code", None) or getattr(response, "status_code", None)
    headers = dict(response.headers) if response is not None and response.headers is not None else {}
    text = f"Azure {code or status} in {where}: {message}"
    return map_error(code, text, status, retry_after_s=_retry_after(headers))


def _retry_after(headers: Mapping[str, str] | None) -> float:
    for key, value in (headers or {}).items():
        if key.lower() == "retry-after":
            try:
                return max(1.0, float(value))
            except ValueError:
                break
    return 10.0
