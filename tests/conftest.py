"""Shared fixtures: databases (SQLite and a real PostgreSQL), app contexts, a live
server on 127.0.0.1, and tokens.

`db_url` is parametrized over both backends, so a test that takes it runs twice.
The PostgreSQL server is started once per session (or taken from
AUTOSCALER_TEST_PG_URL); each test gets a fresh database cloned from a migrated
template, which costs milliseconds instead of a migration run.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.api.app import create_app
from autoscaler.api.context import AppContext
from autoscaler.auth.sealing import SecretKeys
from autoscaler.auth.tokens import create_token
from autoscaler.clock import ManualClock, SystemClock
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.queueing.queues import sync_from_config
from autoscaler.state.db import make_engine, session_factory, transaction, upgrade
from tests.pgserver import PostgresServer

REPO = Path(__file__).resolve().parents[1]
_counter = itertools.count()
# Agents started as root run tasks as the unprivileged `autoscaler-task` user. Most
# tests' task commands are this test process's interpreter, which may live where
# that user cannot reach (a Python under /root), so agents these tests start by any
# route run tasks as root, explicitly allowed: through the environment (local
# provider) and FAST_AGENT's flags (Slurm jobs, which do not inherit it). The tests
# of the unprivileged path (tests/agent/test_task_user.py) clear these. Agents keep
# their worker token in a state dir (root's default: /var/lib/autoscaler-agent);
# tests' agents keep theirs in a throwaway one, one per pytest process: xdist workers
# inherit the main process's environment, and agents of two workers must not share one
# worker.json.
_ROOT_TASKS = ["--run-as=root", "--allow-root-tasks"] if os.geteuid() == 0 else []
if os.geteuid() == 0:
    os.environ.setdefault("AUTOSCALER_RUN_AS", "root")
    os.environ.setdefault("AUTOSCALER_ALLOW_ROOT_TASKS", "1")
if "AUTOSCALER_STATE_DIR" not in os.environ or "PYTEST_XDIST_WORKER" in os.environ:
    os.environ["AUTOSCALER_STATE_DIR"] = tempfile.mkdtemp(prefix="autoscaler-test-agent-state-")
    atexit.register(shutil.rmtree, os.environ["AUTOSCALER_STATE_DIR"], True)
# The CLI sizes its tables by COLUMNS (a pipe, as in these tests, gets unlimited width).
# xdist workers start with COLUMNS=80 and LINES=24 that the terminal did not set, and a
# developer's shell may export them: a test that needs a width passes COLUMNS itself.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
# Agent intervals shrunk so a whole lifecycle takes seconds (agents started by a
# provider: Slurm jobs, the hybrid end to end); tests/agent keeps its own, finer set.
FAST_AGENT = [
    "--heartbeat-interval=0.2",
    "--lease-interval=0.2",
    "--log-flush=0.2",
    "--drain-deadline=1",
    "--kill-grace=1",
    "--request-timeout=2",
    "--backoff-max=0.5",
    "--register-timeout=20",
    f"--state-dir={os.environ['AUTOSCALER_STATE_DIR']}",
    *_ROOT_TASKS,
]

TEST_CONFIG = """
deployment: test
teams:
  - {name: vision}
  - {name: nlp}
queues:
  - {name: gpu, pools: [gpu-pool], priority: 10}
  - {name: cpu, pools: [cpu-pool]}
  - {name: vision-only, pools: [gpu-pool], teams: [vision]}
pools:
  - name: gpu-pool
    provider: fake
    max_instances: 4
    instance_types: [{name: g.1, gpus: 1, gpu_type: A10G, cpus: 4, memory_mb: 16000, on_demand_price: 1.0, spot_price: 0.4}]
  - name: cpu-pool
    provider: fake
    instance_types: [{name: c.1, gpus: 0, cpus: 2, memory_mb: 4000, on_demand_price: 0.1}]
"""


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    external = os.environ.get("AUTOSCALER_TEST_PG_URL")
    if external:
        yield external
        return
    server = PostgresServer()
    try:
        url = server.start()
    except Exception as exc:  # a missing server is a harness failure, never a skip
        pytest.fail(f"cannot start the test PostgreSQL server: {exc}")
    yield url
    server.stop()


@pytest.fixture(scope="session")
def _pg_template(pg_server_url: str) -> str:
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text("DROP DATABASE IF EXISTS autoscaler_template"))
        c.execute(text("CREATE DATABASE autoscaler_template"))
    admin.dispose()
    engine = make_engine(pg_server_url.rsplit("/", 1)[0] + "/autoscaler_template")
    upgrade(engine)
    engine.dispose()
    return "autoscaler_template"


@pytest.fixture
def pg_url(pg_server_url: str, _pg_template: str) -> Iterator[str]:
    """A fresh, migrated PostgreSQL database for this test."""
    name = f"t{os.getpid()}_{next(_counter)}"
    admin = create_engine(pg_server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name} TEMPLATE {_pg_template}"))
    yield pg_server_url.rsplit("/", 1)[0] + "/" + name
    with admin.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    admin.dispose()


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()  # closing the last connection checkpoints the WAL into the file
    return path


@pytest.fixture
def sqlite_url(_sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "autoscaler.db"
    shutil.copy(_sqlite_template, path)
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated database: the test runs once per backend."""
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def sessions(engine: Engine) -> sessionmaker[Session]:
    return session_factory(engine)


@pytest.fixture
def config() -> AutoscalerConfig:
    return parse_config(TEST_CONFIG, Path("test.yaml"))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))


def make_context(config: AutoscalerConfig, sessions: sessionmaker[Session], clock: Any = None) -> AppContext:
    ctx = AppContext(config=config, sessions=sessions, clock=clock or SystemClock(), secret_keys=SecretKeys.generate())
    with transaction(sessions) as s:
        sync_from_config(s, config, now=ctx.clock.now())
    return ctx


@pytest.fixture
def ctx(config: AutoscalerConfig, sessions: sessionmaker[Session]) -> AppContext:
    return make_context(config, sessions)


def issue_token(ctx: AppContext, kind: str, **kw: Any) -> str:
    with transaction(ctx.sessions) as s:
        plaintext, _ = create_token(s, kind=kind, now=ctx.clock.now(), **kw)  # type: ignore[arg-type]
    return plaintext


@pytest.fixture
def admin_token(ctx: AppContext) -> str:
    return issue_token(ctx, "admin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """The real app served by uvicorn in a thread on 127.0.0.1."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(ctx)
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        )
        self._thread = threading.Thread(target=self._server.run, daemon=True)

    def start(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("live server did not start in 10 s")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


@pytest.fixture
def live_server(ctx: AppContext) -> Iterator[LiveServer]:
    server = LiveServer(ctx).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """One real single-node Slurm cluster per session (tests/fakes/slurm.py)."""
    import tempfile

    from tests.fakes.slurm import SlurmCluster

    # Not under pytest's tmp dir: munged wants every parent of its socket world-traversable.
    root = Path(tempfile.mkdtemp(prefix="autoscaler-slurm-"))
    cluster = SlurmCluster(root)
    try:
        cluster.start()
    except Exception as exc:  # missing packages are installed by `make test`, never skipped
        cluster.stop()
        pytest.fail(f"cannot start the test Slurm cluster: {exc}")
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` keeps the tests of tests/xdist_groups.py on one worker each."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.xdist_groups import GroupScheduling

    return GroupScheduling(config, log)
