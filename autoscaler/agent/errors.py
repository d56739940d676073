"""Errors the agent reports to whoever started it, as one line each."""

from __future__ import annotations

from autoscaler.errors import AutoscalerError


class AgentError(AutoscalerError):
    """The agent cannot go on (bad bootstrap, refused registration); the message says why."""
