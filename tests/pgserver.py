"""A throwaway PostgreSQL server for the test suite.

Debian's PostgreSQL refuses to run as root, so the data directory belongs to the
`postgres` user and the binaries run through `runuser`. The server listens on
127.0.0.1 on a free port with fsync off; `stop()` removes everything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bindir() -> Path:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        if (Path(out) / "initdb").exists():
            return Path(out)
    except (OSError, subprocess.CalledProcessError):
        pass
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not candidates:
        raise RuntimeError("PostgreSQL server binaries not found: run `make test` (it installs postgresql)")
    return candidates[-1].parent


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = _bindir()
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="autoscaler-pg-"))
        self.data = self.dir / "data"
        self._as_postgres = os.geteuid() == 0

    def _run(self, *args: str) -> None:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    def start(self) -> str:
        os.chmod(self.dir, 0o755)
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8")
        opts = (
            f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c listen_addresses=127.0.0.1 "
            f"-c port={self.port} -c unix_socket_directories={self.dir} -c max_connections=300"
        )
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "start"
        )
        return self.url

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def restart(self) -> None:
        """Stop and start again on the same port (for fault-injection tests)."""
        # `-l` as in start(): without it the new postmaster inherits our captured stdout
        # pipe and subprocess.run() waits for an EOF that never comes.
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.data),
            "-m",
            "fast",
            "-l",
            str(self.dir / "log"),
            "-w",
            "restart",
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


if __name__ == "__main__":  # manual use: python tests/pgserver.py  (prints the URL, Ctrl-C stops)
    server = PostgresServer()
    print(server.start(), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()
