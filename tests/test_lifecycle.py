"""The lifecycle tables are the only source of task, instance and worker states, and
every change the code makes is an edge of them.

Three ways to break that promise, three kinds of test: a table that contradicts its
own derived sets; a writer that lets an illegal edge through (or refuses a legal one);
code that moves a row without a writer, or redefines a set of states by hand.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Session

from autoscaler import lifecycle as lc
from autoscaler.config import InstanceTypeConfig
from autoscaler.errors import Conflict
from autoscaler.lifecycle import InstanceState, TaskState, WorkerState
from autoscaler.queueing.states import move_worker
from autoscaler.queueing.states import transition as move_task
from autoscaler.reconciler.states import transition as move_instance
from autoscaler.sim.engine import SimSettings
from autoscaler.sim.synthetic import generate
from autoscaler.state.db import make_engine, session_factory
from autoscaler.state.models import Instance, Task, Worker
from tests.sim.helpers import one_pool, run

ROOT = Path(__file__).resolve().parents[1] / "autoscaler"
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
TABLES = [
    (TaskState, lc.TASK_TRANSITIONS),
    (InstanceState, lc.INSTANCE_TRANSITIONS),
    (WorkerState, lc.WORKER_TRANSITIONS),
    (lc.RankState, lc.RANK_TRANSITIONS),
]


@pytest.mark.parametrize(("states", "table"), TABLES, ids=["task", "instance", "worker", "rank"])
def test_every_state_has_a_row_and_every_edge_a_reason(states: type, table: dict) -> None:  # type: ignore[type-arg]
    assert set(table) == set(states)
    for src, edges in table.items():
        assert src not in edges, f"{src} -> itself is not an edge (writers treat it as a no-op)"
        for dst, why in edges.items():
            assert dst in set(states)
            assert why.strip(), f"{src} -> {dst} has no reason"


@pytest.mark.parametrize(
    ("table", "start", "final"),
    [
        (lc.TASK_TRANSITIONS, TaskState.QUEUED, lc.TASK_FINAL),
        (lc.INSTANCE_TRANSITIONS, InstanceState.REQUESTED, {InstanceState.TERMINATED}),
        (lc.WORKER_TRANSITIONS, WorkerState.IDLE, {WorkerState.GONE}),
        (lc.RANK_TRANSITIONS, lc.RankState.RESERVED, lc.RANK_FINAL),
    ],
    ids=["task", "instance", "worker", "rank"],
)
def test_every_state_is_reachable_and_only_final_states_are_dead_ends(table: dict, start: object, final: set) -> None:  # type: ignore[type-arg]
    seen, todo = {start}, [start]
    while todo:
        for nxt in table[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    assert seen == set(table)
    assert {s for s, edges in table.items() if not edges} == set(final)


def test_derived_sets_agree_with_the_tables() -> None:
    I = InstanceState  # noqa: E741
    assert all(not lc.TASK_TRANSITIONS[s] for s in lc.TASK_FINAL)
    assert lc.TASK_ACTIVE.isdisjoint(lc.TASK_FINAL)
    assert lc.INSTANCE_BOOTING < lc.INSTANCE_LIVE
    assert lc.INSTANCE_RUNNING < lc.INSTANCE_LIVE
    assert lc.INSTANCE_LIVE.isdisjoint(lc.INSTANCE_ENDED)
    assert set(I) == lc.INSTANCE_LIVE | lc.INSTANCE_ENDED
    assert lc.INSTANCE_FINAL.isdisjoint(lc.INSTANCE_BILLED)
    # A final instance can only go on to `terminated`, and `terminated` nowhere.
    assert all(set(lc.INSTANCE_TRANSITIONS[s]) <= {I.TERMINATED} for s in lc.INSTANCE_FINAL)
    # A dead instance is one the planner terminates: its only way out is `terminating`.
    assert all(set(lc.INSTANCE_TRANSITIONS[s]) == {I.TERMINATING} for s in lc.INSTANCE_DEAD)
    assert set(WorkerState) - {WorkerState.GONE} == lc.WORKER_LIVE
    assert lc.WORKER_LIVE - {WorkerState.DRAINING} == lc.WORKER_LEASABLE
    # A draining worker never takes work again.
    assert not set(lc.WORKER_TRANSITIONS[WorkerState.DRAINING]) & lc.WORKER_LEASABLE


@pytest.fixture
def session(sqlite_url: str) -> Iterator[Session]:
    """A real session that never flushes nor commits: the rows only need to exist for
    the writers, which add history rows and read attempts through it."""
    engine = make_engine(sqlite_url)
    s = session_factory(engine)()
    with s.no_autoflush:
        yield s
    s.rollback()
    s.close()
    engine.dispose()


PAIRS_TASK = list(itertools.product(TaskState, TaskState))
PAIRS_INSTANCE = list(itertools.product(InstanceState, InstanceState))
PAIRS_WORKER = list(itertools.product(WorkerState, WorkerState))


def test_the_task_writer_allows_exactly_the_table(session: Session) -> None:
    for a, b in PAIRS_TASK:
        task = Task(id=f"t-{a}-{b}", queue="gpu", team="vision", command=["true"], state=a.value, attempts=1, gpus=1)
        session.add(task)
        if b in lc.TASK_TRANSITIONS[a]:
            move_task(session, task, b, reason="test", now=NOW)
            assert task.state == b
        else:
            with pytest.raises(Conflict, match=f"is {a.value}; it cannot become {b.value}"):
                move_task(session, task, b, reason="test", now=NOW)
            assert task.state == a


def test_the_instance_writer_allows_exactly_the_table(session: Session) -> None:
    for a, b in PAIRS_INSTANCE:
        inst = Instance(id=f"i-{a}-{b}", pool="p", provider="fake", request_id=f"r-{a}-{b}", state=a.value)
        session.add(inst)
        if a == b or b in lc.INSTANCE_TRANSITIONS[a]:
            move_instance(session, inst, b, reason="test", now=NOW)
            assert inst.state == b
            assert (inst.terminated_at is not None) == (b in lc.INSTANCE_FINAL and a != b)
        else:
            with pytest.raises(Conflict, match=f"is {a.value}; it cannot become {b.value}"):
                move_instance(session, inst, b, reason="test", now=NOW)
            assert inst.state == a


def test_the_worker_writer_allows_exactly_the_table() -> None:
    for a, b in PAIRS_WORKER:
        worker = Worker(id="w1", state=a.value)
        if a == b or b in lc.WORKER_TRANSITIONS[a]:
            move_worker(worker, b)
            assert worker.state == b
        else:
            with pytest.raises(Conflict, match=f"worker w1 is {a.value}; it cannot become {b.value}"):
                move_worker(worker, b)
            assert worker.state == a


def test_a_simulated_day_only_takes_edges_of_the_tables(tmp_path: Path) -> None:
    """Every state change the real server code makes while the simulator drives it
    (leases, finishes, retries, spot reclaims, drains, scale-down) is recorded at the
    ORM attribute and checked against the tables."""
    seen: dict[str, set[tuple[str, str]]] = {"task": set(), "instance": set(), "worker": set()}

    def recorder(kind: str):  # type: ignore[no-untyped-def]
        def on_set(_target: object, value: str, old: object, _initiator: object) -> None:
            if isinstance(old, str) and old != value:
                seen[kind].add((old, value))

        return on_set

    listeners = [
        (Task.state, recorder("task")),
        (Instance.state, recorder("instance")),
        (Worker.state, recorder("worker")),
    ]
    for attr, fn in listeners:
        event.listen(attr, "set", fn)
    try:
        wl = generate(5, tasks=30, span_s=3 * 3600.0, median_duration_s=1200.0)
        cfg = one_pool(wl.teams, gpus=8)
        pool = cfg.pools[0].model_copy(
            update={
                "instance_types": [
                    InstanceTypeConfig(name="g1", gpus=1, gpu_type="V100", on_demand_price=2.0, spot_price=1.0),
                    InstanceTypeConfig(name="g8", gpus=8, gpu_type="V100", on_demand_price=15.0, spot_price=7.0),
                ]
            }
        )
        run(wl, cfg.model_copy(update={"pools": [pool]}), tmp_path, SimSettings(seed=5, preemption_per_hour=0.5))
    finally:
        for attr, fn in listeners:
            event.remove(attr, "set", fn)
    tables = {"task": lc.TASK_TRANSITIONS, "instance": lc.INSTANCE_TRANSITIONS, "worker": lc.WORKER_TRANSITIONS}
    for kind, edges in seen.items():
        table = {str(a): {str(b) for b in bs} for a, bs in tables[kind].items()}
        illegal = sorted((a, b) for a, b in edges if b not in table.get(a, set()))
        assert not illegal, f"{kind} changes outside the table: {illegal}"
    # The run must exercise the machines, or the check above proves nothing.
    assert ("queued", "leased") in seen["task"] and ("running", "interrupted") in seen["task"]
    assert ("idle", "busy") in seen["worker"] and ("busy", "idle") in seen["worker"]
    assert ("ready", "draining") in seen["instance"]


# Who may assign `<row>.state`: the three writers, the pure sync (on its own copies,
# each change applied later through the instance writer) and the simulator's trackers.
STATE_WRITERS = {
    "queueing/states.py": {"task", "worker", "rank"},
    "reconciler/states.py": {"inst"},
    "reconciler/sync.py": {"c"},
    "sim/engine.py": {"track"},
}


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if "migrations" not in rel:
            yield rel, ast.parse(path.read_text(), filename=rel)


def test_only_the_writers_assign_a_state() -> None:
    found = []
    for rel, tree in _modules():
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == "state"
                    and isinstance(t.value, ast.Name)
                    and t.value.id not in STATE_WRITERS.get(rel, set())
                ):
                    found.append(f"{rel}:{node.lineno} {t.value.id}.state")
    assert not found, "state assigned outside its writer: " + ", ".join(found)


def test_no_module_but_lifecycle_spells_out_a_set_of_states() -> None:
    """A tuple, list or set literal of two or more names of one machine's states is a
    redefinition: it belongs in `autoscaler.lifecycle`."""
    machines = [{s.value for s in states} for states, _ in TABLES]
    found = []
    for rel, tree in _modules():
        if rel == "lifecycle.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple | ast.List | ast.Set) and len(node.elts) >= 2:
                words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(words) == len(node.elts) and any(set(words) <= m for m in machines):
                    found.append(f"{rel}:{node.lineno} {words}")
    assert not found, "state sets defined outside autoscaler.lifecycle: " + "; ".join(found)
