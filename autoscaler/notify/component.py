"""Wires delivery into `autoscaler up`: the delivery job on APScheduler, apart from the
reconcile job, so a slow or unreachable receiver never delays a cycle."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from autoscaler.notify.deliver import deliver_pending

if TYPE_CHECKING:
    from autoscaler.server import Runtime

log = logging.getLogger(__name__)
JOB_ID = "alert-delivery"


def notify_component(runtime: Runtime) -> None:
    config, ctx = runtime.config, runtime.ctx
    notifications = config.notifications
    if not notifications.channels:
        return

    def deliver() -> None:
        try:
            deliver_pending(ctx.sessions, config, ctx.clock)
        except Exception:
            log.exception("alert delivery failed; the next run retries")

    runtime.scheduler.add_job(
        deliver,
        "interval",
        seconds=notifications.interval_s,
        id=JOB_ID,
        max_instances=1,
        coalesce=True,
        next_run_time=datetime.now(UTC),
    )
    names = ", ".join(f"{c.name} ({c.type})" for c in notifications.channels)
    runtime.info["alerts"] = f"delivered to {names} every {notifications.interval_s:g} s"
