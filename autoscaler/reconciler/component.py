"""Wires the reconciler into `autoscaler up`: providers for every pool, the reconcile loop
on APScheduler, the debounced waker behind `ctx.wake`, and leader election.

Runs after the policy component (it evaluates through `ctx.policy`) and sets
`ctx.wake` and `ctx.reconciler`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from autoscaler.auth.tokens import create_token
from autoscaler.config import AutoscalerConfig, PoolConfig
from autoscaler.errors import ConfigError
from autoscaler.provisioning import build_provider
from autoscaler.reconciler.cycle import Reconciler, UserData
from autoscaler.reconciler.executor import ThreadedExecutor
from autoscaler.reconciler.leader import LeaderLock
from autoscaler.reconciler.loop import JOB_ID, ReconcileLoop
from providers.base import Provider
from providers.local import LocalProvider, stop_agents

if TYPE_CHECKING:
    from autoscaler.server import Runtime

log = logging.getLogger(__name__)
# Providers whose instances boot from our cloud-init bootstrap (a fake instance runs nothing).
BOOTSTRAPPED = ("aws", "gcp", "azure", "local", "slurm")


def server_url(config: AutoscalerConfig) -> str:
    return config.server.public_url or f"http://{config.server.host}:{config.server.port}"


def bootstrap_user_data(config: AutoscalerConfig, clock_now: Callable[[], datetime]) -> UserData:
    """User-data for one launch, carrying a fresh one-time join token for that pool only."""
    from providers.bootstrap import BootstrapSpec, render_user_data

    def render(session: Session, pool: PoolConfig, request_id: str, nodes: int = 1, /) -> str:
        if pool.provider not in BOOTSTRAPPED:
            return ""
        plaintext, _ = create_token(
            session,
            kind="join",
            now=clock_now(),
            pool=pool.name,
            ttl=timedelta(seconds=pool.boot_timeout_s + 60),
            name=f"launch {request_id}",
            # Bound to this launch: only its provider, and once the provider reported
            # it, only its instance id may register with it (once).
            request_id=request_id,
            provider=pool.provider,
            # A gang launch's k machines share one user-data: its token registers k
            # machines, each a distinct instance of the launch, once.
            max_uses=nodes,
        )
        spec = BootstrapSpec(
            server_url=server_url(config),
            pool=pool.name,
            provider=pool.provider,  # type: ignore[arg-type]
            join_token=plaintext,
            labels=dict(pool.labels),
            simulated_gpus=pool.simulated_gpus.model_dump() if pool.simulated_gpus else None,
        )
        return render_user_data(spec)

    return render


def build_providers(config: AutoscalerConfig, runtime: Runtime) -> dict[str, Provider]:
    """A provider for every pool, static ones included: a static pool's provider lists its
    declared machines (and a typo in `options.machines` fails `up`, not silently later);
    the reconciler never launches or terminates through it (see `Reconciler._sync`)."""
    return {pool.name: build_provider(pool, deployment=config.deployment, home=runtime.home) for pool in config.pools}


def reconciler_component(runtime: Runtime) -> None:
    config, ctx = runtime.config, runtime.ctx
    if not config.reconcile.enabled:
        log.info("reconcile.enabled is false: no reconciler in this process")
        return
    policy = ctx.policy
    if policy is None:
        raise ConfigError("the reconciler needs the policy service: start it with `autoscaler up`")
    providers = build_providers(config, runtime)
    # Launches and terminations run on bounded per-pool thread pools: a cycle never waits
    # on a cloud operation; each outcome wakes the loop, whose next cycle records it.
    executor = ThreadedExecutor()
    reconciler = Reconciler(
        ctx.sessions,
        config,
        ctx.clock,
        providers,
        policy,
        user_data=bootstrap_user_data(config, ctx.clock.now),
        executor=executor,
    )
    engine: Engine = ctx.sessions.kw["bind"]
    lock = LeaderLock(engine)
    loop = ReconcileLoop(reconciler, lock, ctx.clock, debounce_s=config.reconcile.debounce_s)
    # A job line every second of `up` would bury the reconciler's own log lines.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    runtime.scheduler.add_job(
        loop.tick,
        "interval",
        seconds=config.reconcile.interval_s,
        id=JOB_ID,
        max_instances=1,
        coalesce=True,
        next_run_time=datetime.now(UTC),
    )
    loop.scheduler = runtime.scheduler
    executor.on_result = lambda: loop.wake("a provider call finished")
    ctx.wake = loop.wake
    ctx.reconciler = loop
    runtime.on_stop.append(lock.release)
    runtime.on_stop.append(executor.close)
    local = [p for p in providers.values() if isinstance(p, LocalProvider)]
    if local:
        # Ctrl-C on `up`: the agents it started stop too, while the API still answers.
        def stop_local_agents(hurry: threading.Event, say: Callable[[str], None]) -> None:
            stop_agents(local, hurry, say=say)

        runtime.on_shutdown.append(stop_local_agents)
    runtime.info["reconciler"] = (
        f"every {config.reconcile.interval_s:g} s, woken after {config.reconcile.debounce_s:g} s"
    )
