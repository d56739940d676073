"""Properties of exact attribution over random machines, prices, tasks and accrual
times, on both databases: every GPU-second of every machine is charged once (to a
task's team or to the unused line), task costs plus unused cost equal the machines'
cost to the cent, many small accruals equal one, and month boundaries split right."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.ledger import accrue, month_bounds, month_to_date
from autoscaler.state.db import transaction
from autoscaler.state.models import UNUSED, Instance, SpendRecord, TaskAttempt, new_id

START = datetime(2026, 3, 31, 20, 0, tzinfo=UTC)  # 4 h before the month turns
END_MIN = 480
APRIL = datetime(2026, 4, 1, tzinfo=UTC)
TEAMS = ("vision", "nlp", "audio")


def at(minute: int) -> datetime:
    return START + timedelta(minutes=minute)


@dataclass(frozen=True)
class Hold:
    team: str
    gpus: int
    start: int
    end: int | None  # None: still running at the end


@dataclass(frozen=True)
class Machine:
    gpus: int
    price: float
    team: str | None
    launch: int
    end: int | None  # None: alive at the end
    holds: tuple[Hold, ...]


@st.composite
def machines(draw: st.DrawFn) -> Machine:
    gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
    price = draw(st.sampled_from([0.0, 0.37, 1.0, 3.06, 12.5, 32.77]))
    team = draw(st.sampled_from([None, *TEAMS]))
    launch = draw(st.integers(0, 200))
    life = draw(st.integers(1, 400))
    end = None if draw(st.booleans()) else launch + life
    capacity = gpus if gpus else 1
    holds: list[Hold] = []
    for _ in range(draw(st.integers(0, 8))):
        want = draw(st.integers(0, gpus)) if gpus else 0
        s = draw(st.integers(launch, launch + life + 30))
        e = None if draw(st.integers(0, 5)) == 0 else s + draw(st.integers(0, 240))
        weight = want if gpus else 1
        # Like a lease: only where the machine has that many GPUs free the whole time.
        hi = e if e is not None else END_MIN + 1
        if all(
            sum((h.gpus if gpus else 1) for h in holds if h.start <= m < (h.end if h.end is not None else END_MIN + 1))
            + weight
            <= capacity
            for m in range(s, hi)
        ):
            holds.append(Hold(draw(st.sampled_from(TEAMS)), want, s, e))
    return Machine(gpus, price, team, launch, end, tuple(holds))


def _overlap(a: datetime, b: datetime, lo: datetime, hi: datetime) -> float:
    return max((min(b, hi) - max(a, lo)).total_seconds(), 0.0) / 3600.0


def _expected(ms: list[Machine], shared: bool) -> tuple[dict[tuple[str, str], float], list[list[float]]]:
    """(team, month) -> USD, and each hold's cost, computed from the definition."""
    per_month: dict[tuple[str, str], float] = defaultdict(float)
    hold_costs: list[list[float]] = []
    for m in ms:
        life = (at(m.launch), at(min(m.end if m.end is not None else END_MIN, END_MIN)))
        capacity = m.gpus if m.gpus else 1
        costs = []
        for month_lo, month_hi, label in (
            (START - timedelta(days=40), APRIL, "2026-03"),
            (APRIL, at(10**6), "2026-04"),
        ):
            lo, hi = max(life[0], month_lo), min(life[1], month_hi)
            if hi <= lo:
                continue
            used = 0.0
            for h in m.holds:
                he = at(h.end) if h.end is not None else at(END_MIN)
                frac = (h.gpus if m.gpus else 1) / capacity
                usd = frac * _overlap(at(h.start), he, lo, hi) * m.price
                per_month[(h.team, label)] += usd
                used += usd
            unused_to = "shared" if shared or m.team is None else m.team
            per_month[(unused_to, label)] += m.price * _overlap(lo, hi, lo, hi) - used
        for h in m.holds:
            he = at(h.end) if h.end is not None else at(END_MIN)
            costs.append((h.gpus if m.gpus else 1) / capacity * _overlap(at(h.start), he, *life) * m.price)
        hold_costs.append(costs)
    return dict(per_month), hold_costs


def _load(s: Session, ms: list[Machine]) -> tuple[list[str], list[list[int]]]:
    inst_ids, attempt_ids = [], []
    for m in ms:
        inst = Instance(
            request_id=new_id(),
            provider="fake",
            pool="gpu-pool",
            instance_type=f"g.{m.gpus}",
            capacity_type="spot",
            gpus=m.gpus,
            state="ready" if m.end is None else "terminated",
            team=m.team,
            hourly_price=m.price,
            created_at=at(m.launch),
            updated_at=at(m.launch),
            launched_at=at(m.launch),
            terminated_at=None if m.end is None else at(m.end),
        )
        s.add(inst)
        s.flush()
        inst_ids.append(inst.id)
        rows = []
        for n, h in enumerate(m.holds):
            row = TaskAttempt(
                task_id=new_id(),
                attempt=n + 1,
                team=h.team,
                worker_id=None,
                instance_id=inst.id,
                gpus=h.gpus,
                started_at=at(h.start),
                ended_at=None if h.end is None else at(h.end),
                cost_usd=0.0,
                gpu_hours=0.0,
            )
            s.add(row)
            s.flush()
            rows.append(row.id)
        attempt_ids.append(rows)
    return inst_ids, attempt_ids


def _accrue_at(sessions: sessionmaker[Session], minutes: list[int], shared: bool) -> None:
    since = None
    for minute in minutes:
        with transaction(sessions) as s:
            accrue(s, now=at(minute), since=since, shared={"gpu-pool"} if shared else ())
        since = at(minute)


def _state(s: Session) -> tuple[dict[tuple[str, str, str, str], float], dict[int, float]]:
    recs: dict[tuple[str, str, str, str], float] = defaultdict(float)
    for r in s.scalars(select(SpendRecord)):
        recs[(r.instance_id, f"{r.start:%Y-%m}", r.team, r.kind)] += r.cost_usd
    return dict(recs), {a.id: a.cost_usd for a in s.scalars(select(TaskAttempt))}


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ms=st.lists(machines(), min_size=1, max_size=3),
    steps=st.lists(st.integers(0, END_MIN), max_size=12),
    shared=st.booleans(),
)
def test_exact_attribution_properties(
    sessions: sessionmaker[Session], ms: list[Machine], steps: list[int], shared: bool
) -> None:
    with transaction(sessions) as s:
        for table in (TaskAttempt, SpendRecord, Instance):
            s.execute(delete(table))
        inst_ids, attempt_ids = _load(s, ms)
    _accrue_at(sessions, [*sorted(steps), END_MIN], shared)
    want_month, want_holds = _expected(ms, shared)

    with sessions() as s:
        march = month_to_date(s, START)
        april = month_to_date(s, APRIL)
        many = _state(s)
        records = list(s.scalars(select(SpendRecord)))
        attempts = {a.id: a for a in s.scalars(select(TaskAttempt))}
    # Month boundaries split correctly, and each team gets what the definition says.
    for (team, label), usd in want_month.items():
        got = (march if label == "2026-03" else april).get(team, 0.0)
        assert got == pytest.approx(usd, abs=0.005), (team, label)
    assert all((t, "2026-03") in want_month for t in march) and all((t, "2026-04") in want_month for t in april)
    for rec in records:
        lo, hi = month_bounds(rec.start)
        assert lo <= rec.start <= rec.end <= hi
    for m, iid, rows, costs in zip(ms, inst_ids, attempt_ids, want_holds, strict=True):
        life_h = _overlap(at(m.launch), at(m.end if m.end is not None else END_MIN), at(0), at(END_MIN))
        mine = [r for r in records if r.instance_id == iid]
        # Every machine-second and GPU-second charged exactly once.
        assert sum(r.hours for r in mine) == pytest.approx(life_h, abs=1e-6)
        if m.gpus:
            assert sum(r.gpu_hours for r in mine) == pytest.approx(m.gpus * life_h, abs=1e-6)
        # Task costs plus unused cost equal the machine's cost, to the cent.
        task_usd = sum(attempts[a].cost_usd for a in rows)
        unused_usd = sum(r.cost_usd for r in mine if r.kind == UNUSED)
        # (Within half a cent, and in fact to float precision: comparing rounded values
        # would flake on an exact half cent such as 21.165.)
        assert abs(task_usd + unused_usd - m.price * life_h) < 1e-6
        assert sum(r.cost_usd for r in mine) == pytest.approx(m.price * life_h, abs=1e-6)
        for a, usd in zip(rows, costs, strict=True):
            assert attempts[a].cost_usd == pytest.approx(usd, abs=1e-6)

    # Accruing once, from nothing, gives the same segments and attempt costs.
    with transaction(sessions) as s:
        s.execute(delete(SpendRecord))
        for a in s.scalars(select(TaskAttempt)):
            a.cost_usd, a.gpu_hours = 0.0, 0.0
    _accrue_at(sessions, [END_MIN], shared)
    with sessions() as s:
        once = _state(s)
    assert once[0].keys() == many[0].keys()
    for key, usd in once[0].items():
        assert many[0][key] == pytest.approx(usd, abs=1e-6), key
    for key, usd in once[1].items():
        assert many[1][key] == pytest.approx(usd, abs=1e-6), key
