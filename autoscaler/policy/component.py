"""Wires the policy service into `autoscaler up` (`autoscaler.server.build_runtime`
calls `policy_component` first).

It sets `ctx.policy` (the reconciler evaluates through it, the policy endpoints in
`api/routes/policy.py` answer from it), watches the policy directory every
`WATCH_INTERVAL_S` seconds, and closes the engine's child process on stop.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from autoscaler.policy.service import PolicyService

if TYPE_CHECKING:
    from autoscaler.server import Runtime

log = logging.getLogger(__name__)
WATCH_INTERVAL_S = 5.0


def policy_component(runtime: Runtime) -> None:
    config = runtime.config
    service = PolicyService(config.policy, clock=runtime.ctx.clock, teams=config.team_names())
    runtime.ctx.policy = service

    def watch() -> None:
        try:
            service.check_for_changes()
        except Exception:  # the watch must outlive any surprise; the next tick retries
            log.exception("policy directory watch failed")

    runtime.scheduler.add_job(
        watch, "interval", seconds=WATCH_INTERVAL_S, id="policy-watch", max_instances=1, coalesce=True
    )
    runtime.on_stop.append(service.close)
    runtime.info["policy_revision"] = service.revision
