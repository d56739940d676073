"""CLI commands that run the control plane itself: server, up, db upgrade."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoscaler.cli import app
from autoscaler.config import AutoscalerConfig, load_config, read_environment
from autoscaler.errors import ConfigError
from autoscaler.logging_setup import configure_logging

# The server stack (FastAPI, SQLAlchemy, Alembic) is imported inside the commands that
# need it, so client commands like `autoscaler tasks` start fast.

db_app = typer.Typer(help="Database schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
key_app = typer.Typer(help="The key file sealing task secret_env (server side).", no_args_is_help=True)
app.add_typer(key_app, name="secret-key")

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="autoscaler.yaml (env AUTOSCALER_CONFIG).")]
EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "local.yaml"


def _load(
    config: Path | None, home: Path | None, host: str | None, port: int | None, tls_upstream: bool
) -> tuple[AutoscalerConfig, Path]:
    settings = read_environment()
    cfg = load_config(config, settings)
    server = cfg.server.model_copy(update={k: v for k, v in {"host": host, "port": port}.items() if v is not None})
    if tls_upstream:
        server = server.model_copy(update={"tls_terminated_upstream": True})
    return cfg.model_copy(update={"server": server}), (home or settings.home)


def _require_home(home: Path) -> None:
    """The commands that work on an existing deployment (its database, its key file)
    refuse a home that does not exist rather than make one: a mistyped --home would
    otherwise get a new, empty deployment (`server`, `up` and `db upgrade` make it)."""
    if not home.is_dir():
        raise ConfigError(
            f"home {home} does not exist: check --home (or AUTOSCALER_HOME); the server makes it at its first start"
        )


def _existing_key_dir(path: Path, home: Path) -> None:
    """The key file's directory must exist: the home (see `_require_home`), or, for a
    key file elsewhere (server.secret_key_file), its own directory."""
    if path.is_relative_to(home):
        _require_home(home)
    elif not path.parent.is_dir():
        raise ConfigError(
            f"{path}: directory {path.parent} does not exist: check server.secret_key_file "
            "(or AUTOSCALER_SECRET_KEY_FILE); the server makes it at its first start"
        )


Host = Annotated[str | None, typer.Option("--host", help="Listen address (default 127.0.0.1).")]


def _port(value: int | None) -> int | None:
    # A callback, not typer's min/max: those print "[0<=x<=65535]" in the help's type
    # column, which then cuts longer option names at 80 columns.
    if value is not None and not 0 <= value <= 65535:
        raise typer.BadParameter(f"{value} is not a port: use 0-65535")
    return value


Port = Annotated[int | None, typer.Option("--port", callback=_port, help="Listen port 0-65535 (default 8080).")]
Home = Annotated[Path | None, typer.Option("--home", help="Home dir: SQLite file, logs, admin token.")]
TlsUpstream = Annotated[
    bool, typer.Option("--tls-terminated-upstream", help="Allow a non-loopback address: TLS ends in a proxy in front.")
]


Workers = Annotated[
    int,
    typer.Option(
        "--workers",
        help="API processes sharing the port (PostgreSQL only; about one per core). Housekeeping runs once.",
    ),
]


@app.command()
def server(
    config: ConfigOpt = None,
    home: Home = None,
    host: Host = None,
    port: Port = None,
    tls_terminated_upstream: TlsUpstream = False,
    workers: Workers = 1,
) -> None:
    """Run the API server only (housekeeping included, no reconciler)."""
    from autoscaler.server import build_runtime, check_workers, serve

    configure_logging()  # JSON lines when AUTOSCALER_LOG_FORMAT=json
    cfg, home_dir = _load(config, home, host, port, tls_terminated_upstream)
    check_workers(cfg, home_dir, workers)  # before migrating anything
    serve(
        build_runtime(cfg, home_dir, full_loop=False), workers=workers, config_path=config or read_environment().config
    )


@app.command()
def up(
    config: ConfigOpt = None,
    home: Home = None,
    host: Host = None,
    port: Port = None,
    tls_terminated_upstream: TlsUpstream = False,
) -> None:
    """Run the whole control plane on this machine (what `make run` starts)."""
    from autoscaler.server import build_runtime, serve

    configure_logging()  # JSON lines when AUTOSCALER_LOG_FORMAT=json
    if config is None and read_environment().config is None and EXAMPLE_CONFIG.exists():
        config = EXAMPLE_CONFIG
    cfg, home_dir = _load(config, home, host, port, tls_terminated_upstream)
    serve(build_runtime(cfg, home_dir, full_loop=True))


@db_app.command("upgrade")
def db_upgrade(config: ConfigOpt = None, home: Home = None, revision: str = "head") -> None:
    """Apply schema migrations (safe to run repeatedly)."""
    from autoscaler.server import open_database

    cfg, home_dir = _load(config, home, None, None, False)
    home_dir.mkdir(parents=True, exist_ok=True)
    open_database(cfg, home_dir, revision)
    typer.echo(f"database at revision {revision}")


@db_app.command("prune")
def db_prune(config: ConfigOpt = None, home: Home = None) -> None:
    """Delete history older than the retention settings keep (the server also does this daily)."""
    from datetime import UTC, datetime

    from sqlalchemy import inspect
    from sqlalchemy.exc import OperationalError

    from autoscaler.server import database_url
    from autoscaler.state.db import make_engine, session_factory, transaction
    from autoscaler.state.retention import prune

    cfg, home_dir = _load(config, home, None, None, False)
    engine = make_engine(database_url(cfg, home_dir))
    try:
        tables = inspect(engine).get_table_names()
    except OperationalError as exc:
        raise ConfigError(
            f"cannot open the database ({exc.orig}): check --home (now {home_dir}) or database_url"
        ) from None
    if "tasks" not in tables:
        raise ConfigError("the database has no autoscaler tables yet: nothing to prune (the server creates them)")
    with transaction(session_factory(engine)) as s:
        pruned = prune(s, cfg.retention, now=datetime.now(UTC))
    typer.echo(f"deleted {pruned.describe()}")


@db_app.command("downgrade")
def db_downgrade(revision: str, config: ConfigOpt = None, home: Home = None) -> None:
    """Revert schema migrations to REVISION (e.g. base)."""
    from autoscaler.server import database_url
    from autoscaler.state.db import downgrade, make_engine

    cfg, home_dir = _load(config, home, None, None, False)
    if cfg.database_url is None:  # the SQLite file in the home
        _require_home(home_dir)
    downgrade(make_engine(database_url(cfg, home_dir)), revision)
    typer.echo(f"database at revision {revision}")


@key_app.command("rotate")
def key_rotate(config: ConfigOpt = None, home: Home = None) -> None:
    """Put a new key first in the key file (it seals from the next server start on);
    the old keys stay below it and still open what they sealed."""
    from autoscaler.auth.sealing import rotate_key_file
    from autoscaler.server import secret_key_path

    cfg, home_dir = _load(config, home, None, None, False)
    path = secret_key_path(cfg, home_dir)
    _existing_key_dir(path, home_dir)
    path.parent.mkdir(parents=True, exist_ok=True)  # a key file in a directory under the home
    new, kept = rotate_key_file(path)
    typer.echo(
        f"{path}: new key {new} seals from the next server start" + (f"; kept {', '.join(kept)}" if kept else "")
    )
    typer.echo("restart every server process, then `autoscaler secret-key reseal` before removing old keys")


@key_app.command("reseal")
def key_reseal(config: ConfigOpt = None, home: Home = None) -> None:
    """Seal every stored secret env again with the key file's first key, so the keys
    below it can be removed."""
    from autoscaler.auth.sealing import reseal_tasks
    from autoscaler.server import database_url, load_secret_keys, secret_key_path
    from autoscaler.state.db import make_engine, session_factory, transaction

    cfg, home_dir = _load(config, home, None, None, False)
    _existing_key_dir(secret_key_path(cfg, home_dir), home_dir)
    keys = load_secret_keys(cfg, home_dir, create=False)
    with transaction(session_factory(make_engine(database_url(cfg, home_dir)))) as s:
        count, used = reseal_tasks(s, keys)
    old = keys.ids[1:]
    was = f" (they were sealed with {', '.join(sorted(used))})" if used else ""
    typer.echo(f"resealed the secret env of {count} tasks with key {keys.ids[0]}{was}")
    if old:
        typer.echo(f"no stored value needs {', '.join(old)} any more: they may be removed from {keys.source}")
