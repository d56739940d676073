"""EC2 error codes -> the typed provider errors, with the scope each one blocks.

Pure: a table and a lookup, so the mapping is tested without a network. Prefix
entries (`InvalidAMIID.`) cover the families EC2 spells with a suffix.
"""

from __future__ import annotations

from collections.abc import Callable

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

Factory = Callable[[str, str], ProviderError]


def _capacity(scope: Scope) -> Factory:
    return lambda code, msg: CapacityError(msg, scope=scope, code=code)


def _quota(scope: Scope) -> Factory:
    return lambda code, msg: QuotaError(msg, scope=scope, code=code)


def _rate(code: str, msg: str) -> ProviderError:
    return RateLimited(msg, retry_after_s=5.0, code=code)


def _not_found(code: str, msg: str) -> ProviderError:
    return NotFound(msg, code=code)


def _auth(code: str, msg: str) -> ProviderError:
    return AuthError(msg, code=code)


def _invalid(code: str, msg: str) -> ProviderError:
    return InvalidRequest(msg, code=code)


def _transient(code: str, msg: str) -> ProviderError:
    return TransientError(msg, code=code)


# code -> (factory, what the reconciler does); the comment column is docs/providers.md's table.
ERROR_MAP: dict[str, Factory] = {
    # No capacity for this type in this zone now: try another type/zone/capacity type.
    "InsufficientInstanceCapacity": _capacity(Scope.OFFERING),
    "InsufficientHostCapacity": _capacity(Scope.OFFERING),
    "InsufficientCapacity": _capacity(Scope.OFFERING),
    "UnfulfillableCapacity": _capacity(Scope.OFFERING),
    "SpotMaxPriceTooLow": _capacity(Scope.OFFERING),
    "Unsupported": _capacity(Scope.OFFERING),  # the type is not offered in that zone
    "InsufficientFreeAddressesInSubnet": _capacity(Scope.ZONE),
    # The account's spot instance limit in the region: spot there is out, on-demand is not.
    "MaxSpotInstanceCountExceeded": _capacity(Scope.REGION),
    # Account quotas: nothing in the region launches until an operator raises them.
    "VcpuLimitExceeded": _quota(Scope.REGION),
    "InstanceLimitExceeded": _quota(Scope.REGION),
    "MaxSpotFleetRequestCountExceeded": _quota(Scope.REGION),
    "LaunchTemplateLimitExceeded": _quota(Scope.REGION),
    "PlacementGroupLimitExceeded": _quota(Scope.REGION),
    # Throttled: back off; nothing is marked unavailable.
    "RequestLimitExceeded": _rate,
    "Throttling": _rate,
    "ThrottlingException": _rate,
    "RequestThrottled": _rate,
    "TooManyRequestsException": _rate,
    "InvalidInstanceID.NotFound": _not_found,
    "InvalidInstanceID.Malformed": _not_found,
    # Credentials or permissions: stop using the provider until fixed.
    "AuthFailure": _auth,
    "UnauthorizedOperation": _auth,
    "InvalidClientTokenId": _auth,
    "SignatureDoesNotMatch": _auth,
    "ExpiredToken": _auth,
    "RequestExpired": _auth,
    "OptInRequired": _auth,
    "Blocked": _auth,
    # Server side: retry with backoff.
    "InternalError": _transient,
    "InternalFailure": _transient,
    "ServiceUnavailable": _transient,
    "Unavailable": _transient,
}

PREFIX_MAP: dict[str, Factory] = {
    "InvalidAMIID.": _invalid,
    "InvalidSubnetID.": _invalid,
    "InvalidGroup.": _invalid,
    "InvalidParameter": _invalid,
    "InvalidLaunchTemplate": _invalid,
    "InvalidKeyPair.": _invalid,
    "InvalidBlockDeviceMapping": _invalid,
    "IdempotentParameterMismatch": _invalid,
    # Duplicate (reused by the driver), InUse (deleted later), Unknown (a named group
    # that does not exist: a config error).
    "InvalidPlacementGroup.": _invalid,
}


def map_error(code: str, message: str, http_status: int | None = None) -> ProviderError:
    """The typed error for an EC2 error code; unknown codes by HTTP status (429 rate
    limited, 5xx transient, else invalid)."""
    text = f"EC2 {code}: {message}" if message else f"EC2 {code}"
    factory = ERROR_MAP.get(code)
    if factory is None:
        factory = next((f for p, f in PREFIX_MAP.items() if code.startswith(p)), None)
    if factory is None and http_status == 429:
        factory = _rate  # a throttle under a code this table does not know yet
    if factory is None:
        factory = _transient if http_status is not None and http_status >= 500 else _invalid
    return factory(code, text)
