"""A hypothesis property over random mixes of gangs and single tasks on a fixed fleet,
driving the real `lease`, `mark_started` and `finish` on SQLite while the clock moves:

- never a partially started gang: a gang's ranks are either all reserved (the task
  queued) or all leased/running (the task leased/running), never some of each;
- no GPU is held twice: a worker's tasks and ranks together fit its GPUs;
- reservations are released after their timeout: no reserved rank outlives it;
- quota and budget count the whole gang: a team never holds more GPUs than its quota
  (a gang's N x G from its first reservation), and what it was admitted to spend
  (a gang's N ranks at its first reservation) stays within its headroom;
- no deadlock: every task that is admissible at all (fits a machine, N machines exist,
  N x G within the quota and the budget) has succeeded when the clock has run on.
"""

from __future__ import annotations

import itertools
import random
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from autoscaler.admission import store as admission_store
from autoscaler.admission.model import admissions
from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.lifecycle import RANK_HOLDING
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.queueing import gangs
from autoscaler.queueing import tasks as ops
from autoscaler.state.db import make_engine, session_factory, transaction
from autoscaler.state.models import Task, TaskRank, Worker
from tests.admission.test_lease_gate import machine
from tests.conftest import TEST_CONFIG, make_context
from tests.queueing.helpers import add_task

TEAMS = ["a", "b"]
TIMEOUT_S = 120.0
PRICE, GPUS = 2.0, 2  # every machine: 2 GPUs at 2 USD/h, on the shared line
_n = itertools.count()

work = st.lists(
    st.tuples(
        st.sampled_from(TEAMS),
        st.sampled_from([1, 1, 2, 2, 3, 5]),  # nodes (5: more machines than the fleet has)
        st.sampled_from([1, 2]),  # GPUs per node
        st.integers(1, 6),  # run time in steps
    ),
    min_size=1,
    max_size=10,
)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    fleet=st.integers(2, 4),
    queue=work,
    quota=st.none() | st.integers(2, 6),
    headroom=st.none() | st.floats(4.0, 12.0),
    seed=st.integers(0, 2**16),
)
def test_gangs_never_start_partially_never_deadlock_and_count_whole(
    _sqlite_template: Path, tmp_path: Path, fleet: int, queue, quota, headroom, seed: int
) -> None:
    path = tmp_path / f"g{next(_n)}.db"
    shutil.copy(_sqlite_template, path)
    engine = make_engine(f"sqlite:///{path}")
    rng = random.Random(seed)
    try:
        sessions = session_factory(engine)
        clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
        make_context(parse_config(TEST_CONFIG, Path("test.yaml")), sessions, clock)
        workers = [machine(sessions, clock, team=None, gpus=GPUS, price=PRICE, tenancy="shared") for _ in range(fleet)]
        decision = Decision(
            teams={
                "a": TeamDecision(
                    nominal_gpus=quota,
                    borrowing_limit_gpus=0 if quota is not None else None,
                    spend_headroom_per_hour=headroom,
                ),
                "b": TeamDecision(),
            }
        )
        table = admissions(decision, {})
        with transaction(sessions) as s:
            admission_store.write(s, table, now=clock.now())
        run_for: dict[str, int] = {}
        for team, nodes, gpus, steps in queue:
            tid = add_task(sessions, clock, team=team, nodes=nodes, gpus=gpus)
            run_for[tid] = steps
            clock.advance(1)
        settings_ = gangs.GangSettings(reservation_timeout_s=TIMEOUT_S)
        per_gpu = PRICE / GPUS
        admitted_spend = 0.0  # what team a was let spend (its headroom is never given back here)
        running: dict[tuple[str, str], int] = {}  # (worker, task) -> steps left
        reserved_seen: set[str] = set()
        for _step in range(150):
            order = list(workers)
            rng.shuffle(order)
            for w in order:
                for _ in range(3):
                    with transaction(sessions) as s:
                        had = {r.task_id for r in s.scalars(select(TaskRank).where(TaskRank.state == "reserved"))}
                        task = ops.lease(s, w, now=clock.now(), gang_settings=settings_)
                        first_ranks = {
                            r.task_id
                            for r in s.scalars(select(TaskRank).where(TaskRank.worker_id == w))
                            if r.task_id not in had and r.task_id not in reserved_seen
                        }
                        for tid in first_ranks:
                            t = s.get(Task, tid)
                            assert t is not None
                            reserved_seen.add(tid)
                            if t.team == "a":
                                admitted_spend += t.nodes * t.gpus * per_gpu
                        if task is None:
                            break
                        if task.nodes == 1 and task.team == "a":
                            admitted_spend += task.gpus * per_gpu
                        ops.mark_started(s, w, task.id, now=clock.now())
                        running[(w, task.id)] = run_for[task.id]
            for key in list(running):
                running[key] -= 1
                if running[key] <= 0:
                    del running[key]
                    with transaction(sessions) as s:
                        ops.finish(s, key[0], key[1], now=clock.now(), reason="exit", exit_code=0)
            clock.advance(rng.choice([1, 5, 30, 90]))
            _check(sessions, clock, quota)
            if headroom is not None:
                assert admitted_spend <= headroom + 1e-6
            with sessions() as s:
                if all(
                    t.state in ("succeeded",) or not _admissible(t, fleet, quota, headroom)
                    for t in s.scalars(select(Task))
                ):
                    break
        with sessions() as s:
            for t in s.scalars(select(Task)):
                if _admissible(t, fleet, quota, headroom) and headroom is None:
                    assert t.state == "succeeded", f"{t.nodes}x{t.gpus} task of {t.team} is {t.state}: deadlock"
                if not _admissible(t, fleet, quota, headroom):
                    assert t.state == "queued" and t.attempts == 0
    finally:
        engine.dispose()


def _admissible(t: Task, fleet: int, quota: int | None, headroom: float | None) -> bool:
    if t.nodes > fleet or t.gpus > GPUS:
        return False
    if t.team == "a" and quota is not None and t.nodes * t.gpus > quota:
        return False
    return not (t.team == "a" and headroom is not None and t.nodes * t.gpus * PRICE / GPUS > headroom + 1e-9)


def _check(sessions, clock: ManualClock, quota: int | None) -> None:
    holding = {s.value for s in RANK_HOLDING}
    with sessions() as s:
        for t in s.scalars(select(Task).where(Task.nodes > 1)):
            live = [r for r in gangs.all_ranks(s, t.id) if r.state in ("reserved", "leased", "running")]
            states = {r.state for r in live}
            if t.state == "queued":
                assert states <= {"reserved"}, f"gang {t.id} queued with ranks {states}"
                assert len(live) < t.nodes
                for r in live:  # released once older than the timeout (leases ran since)
                    assert (clock.now() - r.reserved_at).total_seconds() <= TIMEOUT_S + 90 + 1e-6
            elif t.state in ("leased", "running"):
                # Every rank of this attempt was handed its start (a rank may have
                # exited 0 already while the others finish).
                this = [r for r in gangs.all_ranks(s, t.id) if r.attempt == t.attempts and r.state != "released"]
                got = {r.state for r in this}
                assert len(this) == t.nodes and got <= {"leased", "running", "exited"}, f"gang {t.id} partially started"
                assert len({r.worker_id for r in this}) == t.nodes  # one rank per machine
        held_by: dict[str, int] = {}
        for w in s.scalars(select(Worker)):
            singles = s.scalars(select(Task).where(Task.worker_id == w.id, Task.state.in_(["leased", "running"])))
            used = sum(t.gpus for t in singles)
            for r in s.scalars(select(TaskRank).where(TaskRank.worker_id == w.id, TaskRank.state.in_(holding))):
                used += len(r.gpu_indices)
            assert used <= w.gpu_count, f"worker {w.id} holds {used} of {w.gpu_count} GPUs"
        for team, (gpus, _n) in ops.team_usage(s).items():
            held_by[team] = gpus
        if quota is not None:
            assert held_by.get("a", 0) <= quota
