"""The snapshot's demand: queued tasks grouped by shape, in one indexed query.

Real databases (SQLite and PostgreSQL), rows inserted as the queue stores them. The
promises: one group per shape with its count and oldest sort key; end reasons other
than a spot reclaim are one group with tasks that never ran; unschedulable and
non-queued tasks are no demand; NULL and 0 stay apart as the former GROUP BY kept
them; the groups come in one fixed order on every backend (the planner breaks ties
by it); and on SQLite the query is answered from the covering index without a sort.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig
from autoscaler.planner.model import DemandGroup
from autoscaler.queueing.queues import sync_from_config
from autoscaler.reconciler.snapshot import demand_query, observe
from autoscaler.state.db import transaction
from autoscaler.state.models import Task, TaskRank

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
_n = 0


def _task(queue: str = "gpu", team: str = "vision", *, age_s: int = 0, **kw: Any) -> dict[str, Any]:
    global _n
    _n += 1
    at = NOW - timedelta(seconds=age_s)
    row: dict[str, Any] = dict(
        id=f"t{_n:05d}",
        queue=queue,
        team=team,
        command=["x"],
        env={},
        gpus=1,
        priority=0,
        state="queued",
        sort_key=at,
        created_at=at,
        updated_at=at,
        gpu_indices=[],
    )
    row.update(kw)
    return row


def _demand(sessions: sessionmaker[Session], config: AutoscalerConfig, rows: list[dict[str, Any]]) -> list[DemandGroup]:
    with transaction(sessions) as s:
        sync_from_config(s, config, now=NOW)
        s.execute(insert(Task), rows)
    with sessions() as s:
        return list(observe(s, config, now=NOW, pool_state={}).demand)


def test_groups_count_the_oldest_and_fold_end_reasons(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    rows = [
        _task(age_s=10),
        _task(age_s=30, end_reason="failed"),  # retried after a failure: same group as never ran
        _task(age_s=20, end_reason="exit"),
        _task(age_s=50, end_reason="interrupted:spot"),  # after a reclaim: its own group
        _task(age_s=5, end_reason="interrupted:spot"),
        _task(age_s=99, state="running"),  # not demand
        _task(age_s=99, unschedulable_reason="no pool has 9 GPUs"),  # not demand
        _task(team="nlp", gpus=2, age_s=1),
    ]
    groups = _demand(sessions, config, rows)
    by = {(g.team, g.gpus, g.after_reclaim): g for g in groups}
    assert set(by) == {("vision", 1, False), ("vision", 1, True), ("nlp", 2, False)}
    assert by[("vision", 1, False)].count == 3
    assert by[("vision", 1, False)].oldest == NOW - timedelta(seconds=30)
    assert by[("vision", 1, True)].count == 2
    assert by[("vision", 1, True)].oldest == NOW - timedelta(seconds=50)
    assert by[("nlp", 2, False)].count == 1


def test_tasks_a_reclaim_requeued_are_grouped_by_their_interruptions_so_far(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    # The capacity choice counts each interruption as one boot spent of the wait target.
    rows = [
        _task(age_s=40, end_reason="interrupted:spot", interruptions=3),
        _task(age_s=10, end_reason="interrupted:spot", interruptions=3),
        _task(age_s=20, end_reason="interrupted:spot", interruptions=9),
        _task(age_s=30, end_reason="interrupted:spot"),  # no count recorded: 0
        _task(age_s=50, end_reason="interrupted:drain", interruptions=5),  # not a reclaim: not counted
        _task(age_s=60, state="running", end_reason="interrupted:spot", interruptions=7),  # not demand
    ]
    groups = _demand(sessions, config, rows)
    by = {(g.after_reclaim, g.reclaims_so_far): g for g in groups}
    assert set(by) == {(True, 0), (True, 3), (True, 9), (False, 0)}
    assert by[(True, 3)].count == 2 and by[(True, 3)].oldest == NOW - timedelta(seconds=40)
    assert by[(True, 9)].count == 1 and by[(True, 9)].oldest == NOW - timedelta(seconds=20)
    assert by[(True, 0)].count == 1 and by[(True, 0)].oldest == NOW - timedelta(seconds=30)
    assert by[(False, 0)].count == 1
    assert sum(g.count for g in groups) == 5


def test_the_order_is_fixed_whatever_the_insertion_order(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    """Shape columns ascending, NULLs first, the reclaim flag after priority: what
    SQLite's sort for the former GROUP BY gave, now the same on every backend."""
    rows = [
        _task(team="vision", gpus=2, priority=1),
        _task(team="vision", gpus=2, priority=0, end_reason="interrupted:spot"),
        _task(team="vision", gpus=2, priority=0, gpu_type="H100"),
        _task(team="nlp", gpus=4),
        _task(team="vision", gpus=2, priority=0),
        _task(team="vision", gpus=2, priority=0, cpus=2.0),
    ]
    groups = _demand(sessions, config, rows)
    assert [(g.team, g.gpus, g.gpu_type, g.priority, g.after_reclaim, g.cpus) for g in groups] == [
        ("nlp", 4, None, 0, False, 0.0),
        ("vision", 2, None, 0, False, 0.0),
        ("vision", 2, None, 0, False, 2.0),
        ("vision", 2, None, 0, True, 0.0),
        ("vision", 2, None, 1, False, 0.0),
        ("vision", 2, "H100", 0, False, 0.0),
    ]


def test_sqlite_answers_the_demand_query_from_the_covering_index(
    sqlite_sessions: sessionmaker[Session],
) -> None:
    with sqlite_sessions() as s:
        sql = str(demand_query().compile(s.get_bind(), compile_kwargs={"literal_binds": True}))
        steps = [str(r[-1]) for r in s.connection().exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}")]
    assert any("COVERING INDEX ix_tasks_demand" in step for step in steps), steps
    assert not any("TEMP B-TREE" in step for step in steps), steps


def test_each_gang_is_a_group_of_its_own_wanting_its_nodes_less_the_ranks_it_holds(
    sessions: sessionmaker[Session], config: AutoscalerConfig
) -> None:
    gang, other = _task(nodes=3, age_s=20), _task(nodes=2, age_s=10)
    single = _task(age_s=5)  # the same shape, one node: stays in the shape's group
    with transaction(sessions) as s:
        sync_from_config(s, config, now=NOW)
        s.execute(insert(Task), [gang, other, single])
        for rank, state in ((0, "reserved"), (1, "released")):  # a released rank is wanted again
            s.add(
                TaskRank(
                    task_id=gang["id"],
                    attempt=1,
                    rank=rank,
                    worker_id=f"w{rank}",
                    gpu_indices=[0],
                    state=state,
                    reserved_at=NOW,
                )
            )
    with sessions() as s:
        snap = observe(s, config, now=NOW, pool_state={})
    singles = [g for g in snap.demand if g.gang is None]
    gangs = {g.gang: g for g in snap.demand if g.gang is not None}
    assert [(g.count, g.oldest) for g in singles] == [(1, NOW - timedelta(seconds=5))]
    assert set(gangs) == {gang["id"], other["id"]}
    first, second = gangs[gang["id"]], gangs[other["id"]]
    assert (first.count, first.nodes, first.reserved, first.machines) == (1, 3, 1, 2)
    assert (second.count, second.nodes, second.reserved, second.machines) == (1, 2, 0, 2)
    assert first.oldest == NOW - timedelta(seconds=20)
    assert [g.gang for g in snap.demand if g.gang] == [gang["id"], other["id"]]  # oldest first
    assert snap.pending_gpus == {"vision": 1 + 2 + 2}


def test_a_fleet_without_gangs_never_asks_for_them(sessions: sessionmaker[Session], config: AutoscalerConfig) -> None:
    from sqlalchemy import event

    statements: list[str] = []
    with transaction(sessions) as s:
        sync_from_config(s, config, now=NOW)
        s.execute(insert(Task), [_task(), _task(gpus=2)])

    def seen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement)

    with sessions() as s:
        engine = s.get_bind()
        event.listen(engine, "before_cursor_execute", seen)
        try:
            demand = observe(s, config, now=NOW, pool_state={}).demand
        finally:
            event.remove(engine, "before_cursor_execute", seen)
    assert all(g.gang is None for g in demand) and len(demand) == 2
    assert statements and not any("tasks.nodes >" in q or "tasks.nodes =" in q for q in statements), statements
