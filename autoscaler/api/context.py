"""What the API needs from the running process, passed in rather than imported as globals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from autoscaler.api.longpoll import LeaseWaiters
from autoscaler.artifacts.store import ArtifactStore
from autoscaler.auth.sealing import SecretKeys
from autoscaler.auth.tokens import PrincipalCache
from autoscaler.clock import Clock, SystemClock
from autoscaler.config import AutoscalerConfig

if TYPE_CHECKING:
    # Only for the annotations: the API must import without the reconciler's providers.
    from autoscaler.policy.service import PolicyService
    from autoscaler.reconciler.loop import ReconcileLoop


@dataclass
class AppContext:
    config: AutoscalerConfig
    sessions: sessionmaker[Session]
    clock: Clock = field(default_factory=SystemClock)
    # Called after enqueue and worker changes; the reconciler debounces it.
    wake: Callable[[str], None] = lambda _reason: None
    # The components `autoscaler up` attaches (`autoscaler.server.build_runtime`); None
    # in `autoscaler server`, whose policy endpoints then say the service is not running.
    policy: PolicyService | None = None
    reconciler: ReconcileLoop | None = None
    # Recently resolved tokens (revocation reaches other processes within its TTL, 5 s).
    principals: PrincipalCache = field(default_factory=PrincipalCache)
    # Seals task secret_env at enqueue and opens it for the leasing worker. None: this
    # process has no key (a task with secret_env is refused; nothing is ever stored plain).
    secret_keys: SecretKeys | None = None
    # Where this deployment keeps the admin token; the login page names it.
    admin_token_file: Path | None = None
    # Where snapshots, outputs and checkpoints are kept (autoscaler.artifacts). None:
    # this server keeps none (tasks that carry code, outputs or checkpoints are refused).
    artifacts: ArtifactStore | None = None
    # Lease requests waiting for work (long-poll): woken by enqueues and requeues here.
    lease_waiters: LeaseWaiters = field(default_factory=LeaseWaiters)
