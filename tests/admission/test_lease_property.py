"""A hypothesis property over random teams, admissions, machines and queues, driving
the real `lease()` until every worker is told "nothing": no quota is exceeded, no
frozen or drained team gets capacity it does not pay for, no team spends more than
its headroom, no task lands where it does not fit, and when the workers stop, no
queued task remained that fitted a worker and was admissible there (no head-of-line
blocking, however the queue is ordered)."""

from __future__ import annotations

import itertools
import shutil
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from autoscaler.admission import right_size
from autoscaler.admission import store as admission_store
from autoscaler.admission.fit import Need, Room, fits
from autoscaler.admission.gate import added_spend, refusal
from autoscaler.admission.model import admissions
from autoscaler.admission.quota import room as quota_room
from autoscaler.admission.right_size import Size, held_back
from autoscaler.clock import ManualClock
from autoscaler.config import parse_config
from autoscaler.policy.schema import Decision, TeamDecision
from autoscaler.queueing import tasks as ops
from autoscaler.state.db import make_engine, session_factory, transaction
from autoscaler.state.models import Instance, Task, Worker
from tests.admission.test_lease_gate import machine
from tests.conftest import TEST_CONFIG, make_context
from tests.queueing.helpers import add_task

TEAMS = ["a", "b", "c"]
_n = itertools.count()

team_decisions = st.fixed_dictionaries(
    {
        "may_scale_up": st.booleans(),
        "drain": st.booleans(),
        "headroom": st.none() | st.floats(0, 6),
        "nominal": st.none() | st.integers(0, 6),
        "borrow": st.none() | st.integers(0, 4),
        "spot_ok": st.booleans(),
    }
)
_OFF = {"may_scale_up": False, "drain": False, "headroom": None, "nominal": None, "borrow": None, "spot_ok": True}
machines = st.lists(
    st.tuples(
        st.sampled_from(["a", "b", "c", None]),
        st.sampled_from([1, 2, 4]),
        st.sampled_from([0.0, 1.0, 3.0]),
        st.sampled_from([0, 2, 8]),
        st.sampled_from(["spot", "on_demand"]),
        st.sampled_from(["team", "shared"]),
        # Right-sizing: the smaller machines of its pool recorded at launch.
        st.sampled_from([(), (Size(1, 8.0, 61_000),), (Size(1, 1.0, 61_000), Size(2, 4.0, 61_000))]),
    ),
    min_size=1,
    max_size=5,
)
tasks = st.lists(
    st.tuples(
        st.sampled_from(TEAMS),
        st.sampled_from([0, 1, 2, 4]),
        st.sampled_from([0, 1, 4]),
        st.sampled_from([None, "A10G", "H100"]),
        st.integers(0, 2),
    ),
    min_size=1,
    max_size=14,
)


@pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(decisions=st.fixed_dictionaries({t: team_decisions for t in TEAMS}), fleet=machines, queue=tasks)
# Found by a full run: the 2-GPU lease leaves 0.50 of a's 2.00 USD/h, so its 1-GPU task
# (0.75) stays queued; the idle check must ask with what is left, not the whole headroom.
@example(
    decisions={t: {**_OFF, **({"may_scale_up": True, "headroom": 2.0} if t == "a" else {})} for t in TEAMS},
    fleet=[(None, 4, 3.0, 0, "on_demand", "team", ())],
    queue=[("a", 0, 0, None, 0), ("a", 0, 0, None, 0), ("a", 2, 0, None, 0), ("a", 1, 0, None, 0)],
)
def test_lease_holds_every_promise(_sqlite_template: Path, tmp_path: Path, decisions, fleet, queue) -> None:
    path = tmp_path / f"p{next(_n)}.db"
    shutil.copy(_sqlite_template, path)
    engine = make_engine(f"sqlite:///{path}")
    try:
        sessions = session_factory(engine)
        clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
        make_context(parse_config(TEST_CONFIG, Path("test.yaml")), sessions, clock)
        workers = [
            machine(sessions, clock, team=team, gpus=g, price=price, cpus=cpus, capacity_type=ct, tenancy=tenancy)
            for team, g, price, cpus, ct, tenancy, _ in fleet
        ]
        with transaction(sessions) as s:
            for w, (*_, smaller) in zip(workers, fleet, strict=True):
                inst = s.scalar(select(Instance).where(Instance.worker_id == w))
                assert inst is not None
                inst.smaller_machines = right_size.to_json(smaller)
        for team, gpus, cpus, gtype, prio in queue:
            add_task(sessions, clock, team=team, gpus=gpus, cpus=cpus, gpu_type=gtype, priority=prio)
            clock.advance(1)
        decision = Decision(
            teams={
                t: TeamDecision(
                    may_scale_up=d["may_scale_up"],
                    drain=d["drain"],
                    spend_headroom_per_hour=d["headroom"],
                    nominal_gpus=d["nominal"],
                    borrowing_limit_gpus=d["borrow"],
                    allowed_capacity_types=["spot", "on_demand"] if d["spot_ok"] else ["on_demand"],
                )
                for t, d in decisions.items()
            }
        )
        table = admissions(decision, {})
        with transaction(sessions) as s:
            admission_store.write(s, table, now=clock.now())
        spent = dict.fromkeys(TEAMS, 0.0)
        held = dict.fromkeys(TEAMS, 0)
        quotas = {t: a.quota for t, a in table.items() if a.quota is not None and t}

        def machine_now(s, w):  # the machine as the gate sees it, with the tasks it holds now
            active = s.scalars(select(Task).where(Task.worker_id == w, Task.state == "leased")).all()
            return ops.machine_of(s, s.get(Worker, w), active)

        def whole(s, w) -> bool:  # every GPU of it free: right-sizing applies
            active = s.scalars(select(Task).where(Task.worker_id == w, Task.state == "leased")).all()
            return sum(t.gpus for t in active) == 0

        # Lease round-robin until every worker gets nothing.
        progress = True
        while progress:
            progress = False
            for w in workers:
                with sessions() as s:
                    before, was_whole = machine_now(s, w), whole(s, w)
                with transaction(sessions) as s:
                    task = ops.lease(s, w, now=clock.now())
                    if task is None:
                        continue
                    progress = True
                    adm = table[task.team]
                    # The gate's own verdict, computed before this lease took effect.
                    assert refusal(adm, before, task.gpus, quota_room(task.team, quotas, held)) is None
                    need = Need(task.gpus, task.gpu_type, task.cpus, task.memory_mb)
                    assert not (was_whole and held_back(need, before.smaller)), "a smaller machine fits it"
                    spent[task.team] += added_spend(adm, before, task.gpus)
                    held[task.team] += task.gpus
        for t, adm in table.items():
            if not t:
                continue
            if adm.headroom_usd_per_hour is not None:
                assert spent[t] <= adm.headroom_usd_per_hour + 1e-6
            if adm.quota is not None and adm.quota.borrowing_limit_gpus is not None:
                assert held[t] <= adm.quota.nominal_gpus + adm.quota.borrowing_limit_gpus
        # What each team may still spend: its headroom less what this run's leases spent
        # (the oracle's own count), as the quota check counts what each team holds.
        left = {
            t: adm
            if adm.headroom_usd_per_hour is None
            else replace(adm, headroom_usd_per_hour=adm.headroom_usd_per_hour - spent.get(t, 0.0))
            for t, adm in table.items()
        }
        with sessions() as s:
            queued = s.scalars(select(Task).where(Task.state == "queued")).all()
            for w in workers:
                worker = s.get(Worker, w)
                assert worker is not None
                active = s.scalars(select(Task).where(Task.worker_id == w, Task.state == "leased")).all()
                assert sum(t.gpus for t in active) <= worker.gpu_count
                if worker.cpus:
                    assert sum(t.cpus for t in active) <= worker.cpus
                room = Room(
                    worker.gpu_count - sum(t.gpus for t in active),
                    worker.gpu_type,
                    worker.cpus - sum(t.cpus for t in active) if worker.cpus else None,
                    None,
                )
                m = machine_now(s, w)
                if worker.tenancy == "team":
                    # Tenancy: one team's work at a time, the launching team's if there is one.
                    teams_here = {t.team for t in active}
                    assert len(teams_here) <= 1
                    assert m.charged_team is None or teams_here <= {m.charged_team}
                empty = not any(t.gpus for t in active)
                for t in queued:
                    need = Need(t.gpus, t.gpu_type, t.cpus, t.memory_mb)
                    fitting = fits(need, room) and not (empty and held_back(need, m.smaller))
                    admissible = refusal(left[t.team], m, t.gpus, quota_room(t.team, quotas, held)) is None
                    assert not (fitting and admissible), f"worker {w} idle while task {t.id} fits and is admissible"
    finally:
        engine.dispose()
