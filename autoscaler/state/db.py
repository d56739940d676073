"""Engine and session factory, and schema upgrades through Alembic.

SQLite (the default) runs in WAL mode with a busy timeout, and every transaction
starts with `BEGIN IMMEDIATE`: one writer at a time, so read-then-write code (leasing)
can never fail half-way on a stale snapshot. PostgreSQL is used as is; leasing there
relies on `FOR UPDATE SKIP LOCKED`; pooled connections are checked only after they
idled (`ping_when_idle`), not on every request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS = Path(__file__).parent / "migrations"
PING_IDLE_S = 10.0  # a pooled connection unused this long is checked before use


def sqlite_url(home: Path) -> str:
    return f"sqlite:///{home / 'autoscaler.db'}"


def make_engine(url: str, **kwargs: Any) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            # Take transaction control from pysqlite so BEGIN IMMEDIATE is ours to send.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin_immediate(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    kwargs.setdefault("pool_size", 10)
    kwargs.setdefault("max_overflow", 20)
    engine = create_engine(url, **kwargs)
    if not kwargs.get("pool_pre_ping"):
        ping_when_idle(engine, PING_IDLE_S)
    return engine


def ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Check a pooled connection before use only if it sat unused for `idle_s`.

    `pool_pre_ping` pays a round trip on every checkout, i.e. on every API request; a
    connection used a moment ago is almost surely alive, and if it is not, the error
    is answered 503 and SQLAlchemy invalidates the whole pool at once, so the next
    request gets fresh connections. A connection that idled (the database may have
    restarted meanwhile) is pinged; a dead one is replaced before the request sees it.
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        since = record.info.get("checked_in")
        if since is None or time.monotonic() - since < idle_s:
            return  # new, or used within idle_s
        try:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
            dbapi_conn.rollback()  # the ping must not leave a transaction open
        except Exception as exc:
            # The pool discards this connection and checks out another (a fresh one).
            raise DisconnectionError(f"pooled connection is dead: {exc}") from exc


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    with factory() as session, session.begin():
        yield session


def alembic_config(engine: Engine) -> AlembicConfig:
    cfg = AlembicConfig()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    command.upgrade(alembic_config(engine), revision)


def downgrade(engine: Engine, revision: str) -> None:
    command.downgrade(alembic_config(engine), revision)
