"""Errors the SDK raises. Each carries the server's own message (`detail`) and the HTTP
status, so a caller can branch on the type and a person can read the message as is.

All derive from `autoscaler.errors.AutoscalerError`, which the CLI prints as one line.
"""

from __future__ import annotations

from autoscaler.errors import AutoscalerError


class SdkError(AutoscalerError):
    """The request failed; `message` says why and what to do."""

    def __init__(self, message: str, *, status: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        # The server's own words (its `detail`), without the status prefix.
        self.detail = detail if detail is not None else message


class ServerUnreachable(SdkError):
    """No answer from the server (refused, timed out, DNS)."""


class AuthError(SdkError):
    """401 or 403: no token, a wrong one, or one that may not do this."""


class NotFoundError(SdkError):
    """404: no such task (or one of another team: ids do not leak)."""


class Rejected(SdkError):
    """400, 409 or 422: the request was understood and refused (invalid field, wrong state)."""


class ServerError(SdkError):
    """5xx: the server or its database is in trouble; retrying later may help."""


class FeatureMissing(SdkError):
    """The server has no such endpoint: it is older than this SDK, or the feature (the
    snapshot store, the artifact store) is not part of it."""


class WaitTimeout(SdkError):
    """`Task.wait(timeout)` ran out before the task ended."""


class NotAScript(SdkError):
    """`run_remotely` was called where there is no script file to send (a REPL, `-c`)."""


def from_status(status: int, detail: str) -> SdkError:
    """The typed error for an HTTP error reply; the message keeps the CLI's `STATUS: detail` form."""
    message = f"{status}: {detail}"
    if status in (401, 403):
        return AuthError(message, status=status, detail=detail)
    if status == 404:
        return NotFoundError(message, status=status, detail=detail)
    if status >= 500:
        return ServerError(message, status=status, detail=detail)
    return Rejected(message, status=status, detail=detail)
