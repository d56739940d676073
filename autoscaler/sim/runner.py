"""Assembles one simulation: a throwaway SQLite database, the policy service
in-process, the config (the user's, or the default priced from the catalog), and runs
the event loop."""

from __future__ import annotations

import gc
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from autoscaler.config import AutoscalerConfig, PolicyConfig
from autoscaler.policy.service import PolicyService
from autoscaler.sim.engine import Progress, SimOutcome, SimSettings, Simulation
from autoscaler.sim.workload import Workload
from autoscaler.state.db import make_engine, session_factory, upgrade


def run_simulation(
    workload: Workload,
    config: AutoscalerConfig,
    *,
    policy_dir: Path | None = None,
    settings: SimSettings | None = None,
    workdir: Path | None = None,
    progress: Progress | None = None,
) -> SimOutcome:
    """Run `workload` through the real loop; the database lives in `workdir` (or a tmp dir)."""
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="autoscaler-sim-")
        workdir = Path(tmp.name)
    engine = make_engine(f"sqlite:///{workdir / 'sim.db'}")

    @event.listens_for(engine, "connect")
    def _fast(dbapi_conn: Any, _record: Any) -> None:
        # A simulation's database is thrown away: durability buys nothing here.
        dbapi_conn.execute("PRAGMA synchronous=OFF")
        # The whole database in SQLite's page cache (64 MiB): late in a long trace the
        # tables outgrow the default 2 MiB and every cycle re-reads pages.
        dbapi_conn.execute("PRAGMA cache_size=-65536")

    upgrade(engine)
    sessions = session_factory(engine)
    policy = PolicyService(PolicyConfig(dir=str(policy_dir) if policy_dir else None), isolate=False)
    sim = Simulation(workload, config, policy, sessions, settings, progress=progress)
    t0 = time.perf_counter()
    # What start-up built (modules, mappers, the policy bundle, the workload's tasks)
    # lives as long as the run: out of the collector's sight, a full collection walks
    # only what the run itself keeps, not the whole heap (a complement to keeping few
    # objects per cycle, which is what bounds the young collections).
    gc.freeze()
    try:
        outcome = sim.run()
    finally:
        gc.unfreeze()
        policy.close()
    outcome.wall_s = time.perf_counter() - t0
    outcome.keepalive = (engine, tmp)
    return outcome
