"""Domain errors. Business code raises these; the API maps them to HTTP codes and the
CLI prints their message as one line. Every message says what was wrong and what to do."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SecurityNote:
    """What a refusal should leave in the security record (see autoscaler.auth.security).
    Never a token: only the id of the token row, when one was recognised."""

    kind: str
    detail: str
    token_id: str | None = None
    token_kind: str | None = None
    pool: str | None = None
    instance_id: str | None = None
    worker_id: str | None = None


class AutoscalerError(Exception):
    """Base of every error a user can cause or must act on."""

    http_status = 400

    def __init__(self, message: str, *, security: SecurityNote | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Set on refusals that are security events; the API records them after the
        # request's transaction rolled back.
        self.security = security


class ConfigError(AutoscalerError):
    """The configuration file or environment is invalid."""


class NotFound(AutoscalerError):
    http_status = 404


class Forbidden(AutoscalerError):
    http_status = 403


class Unauthorized(AutoscalerError):
    http_status = 401


class Conflict(AutoscalerError):
    """The request is valid but the current state forbids it (e.g. cancel a finished task)."""

    http_status = 409


class InvalidInput(AutoscalerError):
    http_status = 422


class MissingExtra(AutoscalerError):
    """An optional dependency is not installed."""

    def __init__(self, extra: str, module: str) -> None:
        super().__init__(
            f"this feature needs the '{extra}' extra ({module} is not installed): pip install 'gpu-autoscaler[{extra}]'"
        )
        self.extra = extra
