"""Assembles a running control plane: config, database, admin token, API and the
background jobs, then serves it with uvicorn.

`autoscaler server` runs the API (plus housekeeping); `autoscaler up` is what
`make run` starts: the API and, in this order, the policy service, the reconciler (with
the pools' providers) and alert delivery, each wired by its `component` function into
the typed fields of `Runtime` and `AppContext`.
"""

from __future__ import annotations

import errno
import gc
import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, OperationalError

from autoscaler.admission.shapes import Catalog
from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from autoscaler.artifacts.backends import open_store
from autoscaler.artifacts.records import expire as expire_artifacts
from autoscaler.auth.sealing import DEFAULT_KEY_FILE, SecretKeys, load_key_file
from autoscaler.auth.tokens import create_token, hash_token
from autoscaler.clock import SystemClock
from autoscaler.config import AutoscalerConfig
from autoscaler.errors import ConfigError
from autoscaler.notify.component import notify_component
from autoscaler.policy.component import policy_component
from autoscaler.queueing.queues import sync_from_config
from autoscaler.queueing.unschedulable import review_queued
from autoscaler.queueing.workers import expire_silent_workers
from autoscaler.reconciler.component import reconciler_component
from autoscaler.state.db import make_engine, session_factory, sqlite_url, transaction, upgrade
from autoscaler.state.models import ApiToken
from autoscaler.state.retention import prune

log = logging.getLogger(__name__)
ADMIN_TOKEN_FILE = "admin.token"
SERVER_URL_FILE = "server.url"
HOUSEKEEPING_INTERVAL_S = 5.0
RETENTION_INTERVAL_S = 3600.0  # artifact retention: hourly is plenty for a setting in days
# How often queued tasks are checked against the config's shapes (also at start).
UNSCHEDULABLE_INTERVAL_S = 60.0


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_listen_address(config: AutoscalerConfig) -> None:
    """Refuse to expose plain HTTP beyond this machine unless TLS terminates in front."""
    host = config.server.host
    if not is_loopback(host) and not config.server.tls_terminated_upstream:
        raise ConfigError(
            f"refusing to listen on {host} without TLS: put a TLS proxy in front and set "
            "server.tls_terminated_upstream: true (or --tls-terminated-upstream), or listen on 127.0.0.1"
        )


def check_port_free(host: str, port: int) -> None:
    """Say which port is taken and how to choose another, before anything is announced
    (uvicorn would print the URL and then `[Errno 98]`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"port {port} on {host} is already in use (another `autoscaler up` or server?): stop that "
                    f"process, or choose another port with --port N or server.port in autoscaler.yaml"
                ) from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def database_url(config: AutoscalerConfig, home: Path) -> str:
    return config.database_url or sqlite_url(home)


def open_database(config: AutoscalerConfig, home: Path, revision: str = "head") -> Engine:
    """The engine of the configured database, its schema migrated to `revision`. A URL
    this service cannot use, or a database it cannot reach, is a ConfigError saying
    which (password hidden) and what to check, not a driver's traceback."""
    url = database_url(config, home)
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        shown = url.split("://", 1)[0] + "://..." if "://" in url else "(not a URL)"
    try:
        engine = make_engine(url)
    except (ArgumentError, ImportError) as exc:
        raise ConfigError(
            f"database_url {shown}: this service cannot use it ({exc}); give sqlite:///PATH or "
            "postgresql://USER@HOST/DB (database_url in autoscaler.yaml or AUTOSCALER_DATABASE_URL)"
        ) from None
    try:
        upgrade(engine, revision)
    except OperationalError as exc:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise ConfigError(
            f"cannot open the database at {shown}: {reason}; check that it runs and that database_url "
            "(or AUTOSCALER_DATABASE_URL) is right"
        ) from None
    return engine


def secret_key_path(config: AutoscalerConfig, home: Path) -> Path:
    """Where the key ring sealing task secret_env lives (relative paths: under HOME)."""
    path = Path(config.server.secret_key_file or DEFAULT_KEY_FILE).expanduser()
    return path if path.is_absolute() else home / path


def load_secret_keys(config: AutoscalerConfig, home: Path, *, create: bool) -> SecretKeys:
    return load_key_file(secret_key_path(config, home), create=create)


def ensure_admin_token(ctx: AppContext, home: Path) -> Path:
    """Create the admin token on first start and keep it in HOME/admin.token (mode 0600)."""
    path = home / ADMIN_TOKEN_FILE
    with transaction(ctx.sessions) as s:
        if path.exists():
            digest = hash_token(path.read_text().strip())
            if s.scalar(select(ApiToken).where(ApiToken.token_hash == digest, ApiToken.kind == "admin")):
                return path
        plaintext, _ = create_token(s, kind="admin", now=ctx.clock.now(), name="bootstrap admin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(plaintext + "\n")
    return path


@dataclass
class Runtime:
    config: AutoscalerConfig
    home: Path
    ctx: AppContext
    scheduler: BackgroundScheduler
    full_loop: bool
    on_stop: list[Callable[[], None]] = field(default_factory=list)
    # Run when a stop is asked (Ctrl-C, SIGTERM) while the API still answers, so the
    # local agents can report their tasks and deregister; `hurry` is set by a second
    # Ctrl-C. Each must return within a bounded time and be safe to call twice.
    on_shutdown: list[Callable[[threading.Event, Callable[[str], None]], None]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def build_runtime(config: AutoscalerConfig, home: Path, *, full_loop: bool) -> Runtime:
    home.mkdir(parents=True, exist_ok=True)
    engine = open_database(config, home)
    ctx = AppContext(
        config=config,
        sessions=session_factory(engine),
        clock=SystemClock(),
        secret_keys=load_secret_keys(config, home, create=True),
        artifacts=open_store(config, home),
    )
    catalog = Catalog.from_config(config)
    with transaction(ctx.sessions) as s:
        sync_from_config(s, config, now=ctx.clock.now())
        # A config that no longer offers a queued task's shape: say so on the task.
        review_queued(s, catalog)
    scheduler = BackgroundScheduler(daemon=True)
    runtime = Runtime(config=config, home=home, ctx=ctx, scheduler=scheduler, full_loop=full_loop)
    runtime.info["admin_token_file"] = ensure_admin_token(ctx, home)
    ctx.admin_token_file = runtime.info["admin_token_file"]  # the login page names it

    def housekeeping() -> None:
        try:
            with transaction(ctx.sessions) as s:
                gone = expire_silent_workers(s, now=ctx.clock.now(), timeout_s=config.reconcile.heartbeat_timeout_s)
            if gone:
                log.warning("workers gone after missed heartbeats: %s", [w.id for w in gone])
                ctx.wake("workers lost")
        except Exception:
            log.exception("housekeeping failed; will retry")

    scheduler.add_job(
        housekeeping, "interval", seconds=HOUSEKEEPING_INTERVAL_S, id="housekeeping", max_instances=1, coalesce=True
    )

    def review_shapes() -> None:
        try:
            with transaction(ctx.sessions) as s:
                review_queued(s, catalog)
        except Exception:
            log.exception("checking queued tasks against the config's shapes failed; will retry")

    scheduler.add_job(
        review_shapes, "interval", seconds=UNSCHEDULABLE_INTERVAL_S, id="unschedulable", max_instances=1, coalesce=True
    )

    def prune_history() -> None:
        try:
            with transaction(ctx.sessions) as s:
                pruned = prune(s, config.retention, now=ctx.clock.now())
            if pruned.total():
                log.info("retention: deleted %s", pruned.describe())
        except Exception:
            log.exception("pruning old history failed; will retry at the next prune")

    # Once at start (a server that restarts daily still prunes), then every interval.
    scheduler.add_job(
        prune_history,
        "interval",
        hours=config.retention.prune_interval_h,
        id="retention",
        max_instances=1,
        coalesce=True,
        next_run_time=datetime.now(UTC),
    )

    def artifact_retention() -> None:
        store = ctx.artifacts
        if store is None:
            return
        try:
            cutoff = ctx.clock.now() - timedelta(days=config.artifacts.retention_days)
            n = expire_artifacts(ctx.sessions, store, older_than=cutoff)
            if n:
                log.info("artifact retention: deleted %d artifact(s) and snapshot(s) older than %s", n, cutoff)
        except Exception:
            log.exception("artifact retention failed; will retry")

    scheduler.add_job(
        artifact_retention, "interval", seconds=RETENTION_INTERVAL_S, id="artifact_retention", max_instances=1
    )
    if full_loop:
        # In this order: the reconciler evaluates through the policy service, and alert
        # delivery sends what the reconcile cycles record.
        policy_component(runtime)
        reconciler_component(runtime)
        notify_component(runtime)
    return runtime


def app_from_env() -> Any:
    """The API alone, for each process of `autoscaler server --workers N`.

    uvicorn starts worker processes from an import string, so the configuration comes
    from the environment the parent set (AUTOSCALER_CONFIG, AUTOSCALER_HOME,
    AUTOSCALER_DATABASE_URL). The parent has already migrated the schema, created
    the admin token and runs housekeeping once for all of them; a worker process only
    answers requests.
    """
    from autoscaler.config import load_config, read_environment

    settings = read_environment()
    config = load_config(settings.config, settings)
    engine = make_engine(database_url(config, settings.home))
    # The parent created the key file; a worker process only reads it.
    ctx = AppContext(
        config=config,
        sessions=session_factory(engine),
        clock=SystemClock(),
        secret_keys=load_secret_keys(config, settings.home, create=False),
        artifacts=open_store(config, settings.home),
    )
    ctx.admin_token_file = settings.home / ADMIN_TOKEN_FILE
    return create_app(ctx)


def check_workers(config: AutoscalerConfig, home: Path, workers: int) -> None:
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, not {workers}")
    if workers > 1 and not database_url(config, home).startswith("postgresql"):
        raise ConfigError(
            "--workers above 1 needs PostgreSQL (set database_url): SQLite takes one writer at a "
            "time, so more processes only add lock waits"
        )


def serve(
    runtime: Runtime,
    *,
    announce: Callable[[str], None] = print,
    workers: int = 1,
    config_path: Path | None = None,
) -> None:
    """Serve the API; with `workers` > 1 (PostgreSQL only), that many uvicorn processes
    share the port while this process keeps housekeeping (and must not run the
    reconciler: `autoscaler up` stays single-process)."""
    config = runtime.config
    check_listen_address(config)
    check_workers(config, runtime.home, workers)
    if workers > 1 and runtime.full_loop:
        raise ConfigError("--workers is for `autoscaler server`; `autoscaler up` runs one process")
    check_port_free(config.server.host, config.server.port)
    url = config.server.public_url or f"http://{config.server.host}:{config.server.port}"
    announce(f"autoscaler control plane at {url}")
    announce(f"admin token: {runtime.info['admin_token_file']}")
    for warning in config.warnings():
        announce(f"warning: {warning}")
    (runtime.home / SERVER_URL_FILE).write_text(url + "\n")
    # What start-up built (modules, mappers, config, the policy bundle) lives as long as
    # the process: out of the collector's sight, each full collection walks only what
    # the running loop keeps (bench/reconcile_cycle.py --gc-freeze: a 1x cycle's full
    # collections 215-414 -> 39 ms). Collected first so no start-up garbage is frozen.
    gc.collect()
    gc.freeze()
    runtime.scheduler.start()
    try:
        if workers > 1:
            # Worker processes inherit this environment and rebuild the config from it.
            os.environ["AUTOSCALER_HOME"] = str(runtime.home)
            if config_path is not None:
                os.environ["AUTOSCALER_CONFIG"] = str(config_path)
            if config.database_url:
                os.environ["AUTOSCALER_DATABASE_URL"] = config.database_url
            uvicorn.run(
                "autoscaler.server:app_from_env",
                factory=True,
                workers=workers,
                host=config.server.host,
                port=config.server.port,
                log_level="warning",
            )
        else:
            server = GracefulServer(
                uvicorn.Config(
                    create_app(runtime.ctx), host=config.server.host, port=config.server.port, log_level="warning"
                ),
                runtime,
                announce,
            )
            server.run()
            if not server.started and not server.should_exit:
                raise ConfigError(f"the server did not start on {config.server.host}:{config.server.port}")
    finally:
        runtime.scheduler.shutdown(wait=False)
        hurry = threading.Event()
        hurry.set()  # a stop that did not come through a signal (an error): no drain time
        for hook in runtime.on_shutdown:
            hook(hurry, announce)
        for stop in runtime.on_stop:
            stop()


class GracefulServer(uvicorn.Server):
    """uvicorn's server, stopped in two steps when `runtime.on_shutdown` has hooks.

    First Ctrl-C (or SIGTERM): the hooks run in a thread while the API still answers
    (the local agents drain, report and deregister), then the server stops. A second
    one sets `hurry` (the hooks stop waiting). A third is uvicorn's own force exit.
    """

    def __init__(self, config: uvicorn.Config, runtime: Runtime, announce: Callable[[str], None]) -> None:
        super().__init__(config)
        self.runtime = runtime
        self.announce = announce
        self.hurry = threading.Event()
        self.draining: threading.Thread | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.runtime.on_shutdown:
            super().handle_exit(sig, frame)
        elif self.draining is None:
            self.draining = threading.Thread(target=self._drain, name="shutdown", daemon=True)
            self.draining.start()
        elif not self.hurry.is_set():
            self.hurry.set()
        else:
            super().handle_exit(sig, frame)

    def _drain(self) -> None:
        try:
            self.runtime.scheduler.pause()  # no reconcile cycle launches while agents stop
            for hook in self.runtime.on_shutdown:
                hook(self.hurry, self.announce)
        except Exception:
            log.exception("stopping the local agents failed")
        finally:
            self.should_exit = True
