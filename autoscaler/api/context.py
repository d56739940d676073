"""What the API needs from the running process, passed in rather than imported as globals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.artifacts.store import ArtifactStore
from autoscaler.auth.sealing import SecretKeys
from autoscaler.auth.tokens import PrincipalCache
from autoscaler.clock import Clock, SystemClock
from autoscaler.config import AutoscalerConfig


@dataclass
class AppContext:
    config: AutoscalerConfig
    sessions: sessionmaker[Session]
    clock: Clock = field(default_factory=SystemClock)
    # Called after enqueue and worker changes; the reconciler debounces it.
    wake: Callable[[str], None] = lambda _reason: None
    # Optional components attached by `autoscaler up` (policy service, reconciler...).
    extras: dict[str, Any] = field(default_factory=dict)
    # Recently resolved tokens (revocation reaches other processes within its TTL, 5 s).
    principals: PrincipalCache = field(default_factory=PrincipalCache)
    # Seals task secret_env at enqueue and opens it for the leasing worker. None: this
    # process has no key (a task with secret_env is refused; nothing is ever stored plain).
    secret_keys: SecretKeys | None = None
    # Where snapshots, outputs and checkpoints are kept (autoscaler.artifacts). None:
    # this server keeps none (tasks that carry code, outputs or checkpoints are refused).
    artifacts: ArtifactStore | None = None
