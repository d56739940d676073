"""Benchmark: N launches on a slow fake provider (seconds per operation), through the real
reconcile cycle with the threaded executor that `autoscaler up` uses.

Enqueues N one-GPU tasks, runs one cycle (which commits N intents and submits N calls),
then waits until every call has finished and runs the next cycle (which records them).
Reported: how long the launching cycle took, when all N instances existed at the fake,
and when the second cycle had recorded them all (`booting`). With the calls made one
after another inside the cycle (before issue 17) the same work took N x the operation
time; `--sync` runs that mode (slow: N x op seconds).

    .venv/bin/python bench/concurrent_launches.py --launches 100 --op-s 5
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select

from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.reconciler.cycle import Reconciler
from autoscaler.reconciler.executor import Executor, SyncExecutor, ThreadedExecutor
from autoscaler.state.db import make_engine, session_factory, upgrade
from autoscaler.state.models import Instance
from tests.conftest import TEST_CONFIG
from tests.reconciler.harness import make_rig, policy_service


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--op-s", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--sync", action="store_true", help="the calls one after another in the cycle")
    args = ap.parse_args()
    n = args.launches
    tmp = Path(tempfile.mkdtemp(prefix="bench-launches-"))
    engine = make_engine(f"sqlite:///{tmp / 'autoscaler.db'}")
    upgrade(engine)
    sessions = session_factory(engine)
    config = parse_config(TEST_CONFIG.replace("max_instances: 4", f"max_instances: {n}"), Path("bench.yaml"))
    clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
    policy = policy_service()
    rig = make_rig(sessions, config, clock, policy)
    fake = rig.fakes["gpu-pool"]
    fake.op_delay_s = args.op_s
    executor: Executor = SyncExecutor() if args.sync else ThreadedExecutor(concurrency=args.concurrency)
    r = Reconciler(sessions, config, clock, dict(rig.fakes), policy, executor=executor)
    try:
        for _ in range(n):
            rig.enqueue()
        t0 = time.perf_counter()
        r.run_cycle()
        cycle_s = time.perf_counter() - t0
        if isinstance(executor, ThreadedExecutor) and not executor.wait_idle(n * args.op_s + 60):
            raise SystemExit("the calls did not finish")
        exist_s = time.perf_counter() - t0
        created = len(fake.live())
        clock.advance(15)
        t1 = time.perf_counter()
        r.run_cycle()
        apply_s = time.perf_counter() - t1
        recorded_s = time.perf_counter() - t0
        with sessions() as s:
            booting = sum(1 for i in s.scalars(select(Instance)) if i.state == "booting")
        calls = fake.calls_of("launch")
        dupes = len(calls) - len({c.arg.request_id for c in calls})
        mode = "sync (calls inside the cycle)" if args.sync else f"threaded (concurrency {args.concurrency})"
        print(f"{n} launches, {args.op_s:g} s per operation, {mode}")
        print(f"  launching cycle returned after   {cycle_s:7.2f} s")
        print(f"  all {created} instances existed after {exist_s:7.2f} s  ({exist_s / args.op_s:.2f} operation times)")
        print(f"  next cycle recorded them in      {apply_s:7.2f} s  ({booting} booting, {recorded_s:.2f} s in all)")
        print(f"  launch calls {len(calls)}, duplicate request ids {dupes}")
    finally:
        executor.close()
        policy.close()
        engine.dispose()


if __name__ == "__main__":
    main()
