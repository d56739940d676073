"""Domain errors. Business code raises these; the API maps them to HTTP codes and the
CLI prints their message as one line. Every message says what was wrong and what to do."""

from __future__ import annotations


class AutoscalerError(Exception):
    """Base of every error a user can cause or must act on."""

    http_status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


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
