"""Leader election: one active reconciler per database.

On PostgreSQL the leader holds a session advisory lock (`pg_try_advisory_lock`) on a
dedicated connection for as long as it lives; when its process dies, the server drops
the session and the lock with it, and a standby's next attempt (every interval) wins.
A leader that finds its connection broken steps down before acting. SQLite is a
single-process database: the only process is always the leader.
"""

from __future__ import annotations

import logging

from sqlalchemy import Connection, Engine, text

log = logging.getLogger(__name__)
# A constant key: one lock per database ("GPUA" in ASCII).
LOCK_KEY = 0x47505541


class LeaderLock:
    def __init__(self, engine: Engine, *, key: int = LOCK_KEY) -> None:
        self.engine = engine
        self.key = key
        self._conn: Connection | None = None
        self.single_process = engine.dialect.name != "postgresql"

    def acquire(self) -> bool:
        """True if this process is (still, or now) the leader."""
        if self.single_process:
            return True
        if self._conn is not None:
            try:
                self._conn.exec_driver_sql("SELECT 1")
                self._conn.commit()
                return True
            except Exception:
                log.warning("leader connection lost; stepping down")
                self._drop()
        try:
            conn = self.engine.connect()
        except Exception:
            log.warning("cannot reach the database to run for leader")
            return False
        try:
            got = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": self.key}).scalar())
            # The lock belongs to the session, not the transaction: end the transaction
            # so the held connection is not left "idle in transaction".
            conn.commit()
        except Exception:
            conn.close()
            return False
        if not got:
            conn.close()
            return False
        self._conn = conn
        log.info("became the active reconciler")
        return True

    def backend_pid(self) -> int | None:
        """The PostgreSQL backend holding the lock (tests kill it to simulate a crash)."""
        if self._conn is None:
            return None
        pid = self._conn.execute(text("SELECT pg_backend_pid()")).scalar()
        self._conn.commit()
        return int(pid) if pid is not None else None

    def release(self) -> None:
        if self._conn is None:
            return
        try:
            self._conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self.key})
            self._conn.commit()
        except Exception:
            pass
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.invalidate()
                conn.close()
            except Exception:
                pass
