"""The ledger: what every machine costs and who pays for it.

Attribution is exact, per second. While tasks hold a machine's GPUs (from lease to
the end of the attempt: task states `leased` and `running`), each task's team pays for
the GPUs it holds: a 2-GPU machine with one GPU leased by team B charges B half its
price for that time. The rest of the machine's billed time (boot, idle, free GPUs
next to a small task) is "unused" and charged to the team whose demand launched it
(`Instance.team`), or to the pool-level "shared" line when the pool says
`unused_cost: shared`; capacity launched for a pool's minimum has no team and is
shared. A GPU-less machine has one task slot: a task on it holds the whole machine
(several at once split it evenly). Tasks holding more GPUs than the machine has (a
worker that reports more than the instance type) split the whole machine by GPUs held.

Spend records are priced segments per (instance, team, month, kind), kind `usage` or
`unused`, so a month's sum and a FOCUS export agree. `accrue` is incremental: each
instance's segments are extended from where they end (its watermark) to now, using
only the attempts overlapping that window, and each attempt's own cost is kept on its
`task_attempts` row. The read functions serve everything that shows money: the policy
input, the dashboard, `/metrics`, `GET /api/v1/spend`, the FOCUS export and the
simulator's report.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any, Protocol, cast

from sqlalchemy import Table, bindparam, func, insert, or_, select
from sqlalchemy.orm import Session

from autoscaler.config import AutoscalerConfig
from autoscaler.ledger.period import month_bounds, month_of, parse_month
from autoscaler.reconciler.states import BILLED
from autoscaler.state.models import UNUSED, USAGE, Instance, SpendRecord, TaskAttempt, Worker

SHARED_TEAM = "shared"
# Instance states in which the provider may still bill us: the burn rate counts these.
BILLED_STATES = tuple(sorted(s.value for s in BILLED))
_CHUNK = 500


def cost(hourly_price: float, start: datetime, end: datetime) -> float:
    return max((end - start).total_seconds(), 0.0) / 3600.0 * hourly_price


def shared_pools(config: AutoscalerConfig) -> frozenset[str]:
    """Pools whose unused capacity is charged to "shared" (`unused_cost: shared`)."""
    return frozenset(p.name for p in config.pools if p.unused_cost == "shared")


def unused_team(inst: Instance, shared: Collection[str]) -> str:
    """Who pays for a machine's free capacity."""
    return _unused_team_of(inst.team, inst.pool, shared)


def _unused_team_of(team: str | None, pool: str, shared: Collection[str]) -> str:
    if team is None or pool in shared:
        return SHARED_TEAM
    return team


# ---------------------------------------------------------------------- splitting


@dataclass
class _Share:
    """What one holder (an attempt, or the unused line) is charged over a window."""

    machine_hours: float = 0.0
    gpu_hours: float = 0.0


def _weight(inst_gpus: int, attempt_gpus: int) -> float:
    return float(attempt_gpus) if inst_gpus > 0 else 1.0


def split(
    inst_gpus: int, holds: Sequence[tuple[datetime, datetime, int]], start: datetime, end: datetime
) -> tuple[list[_Share], _Share]:
    """Split [start, end) of one machine among `holds` ((from, to, gpus), clipped to
    the window here) and the unused remainder: machine-hours and GPU-hours of each."""
    capacity = float(inst_gpus) if inst_gpus > 0 else 1.0
    clipped = [(max(a, start), min(b, end), _weight(inst_gpus, g)) for a, b, g in holds]
    shares = [_Share() for _ in holds]
    unused = _Share()
    points = sorted({start, end, *(a for a, b, _ in clipped if a < b), *(b for a, b, _ in clipped if a < b)})
    # A sweep: which holds are active in each elementary interval.
    opens: dict[datetime, list[int]] = defaultdict(list)
    closes: dict[datetime, list[int]] = defaultdict(list)
    for i, (a, b, _) in enumerate(clipped):
        if a < b:
            opens[a].append(i)
            closes[b].append(i)
    active: set[int] = set()
    for p, q in pairwise(points):
        active.difference_update(closes.get(p, ()))
        active.update(opens.get(p, ()))
        hours = (q - p).total_seconds() / 3600.0
        if hours <= 0:
            continue
        held = sum(clipped[i][2] for i in active)
        denom = max(capacity, held)
        for i in active:
            part = clipped[i][2] / denom
            shares[i].machine_hours += part * hours
            if inst_gpus > 0:
                shares[i].gpu_hours += part * inst_gpus * hours
        free = max(0.0, 1.0 - held / capacity)
        unused.machine_hours += free * hours
        unused.gpu_hours += free * inst_gpus * hours
    return shares, unused


# ---------------------------------------------------------------------- accrual


def _chunks(items: Sequence[str]) -> Iterable[list[str]]:
    for i in range(0, len(items), _CHUNK):
        yield list(items[i : i + _CHUNK])


class _AttemptRef(Protocol):
    """What `_resolve` reads of an attempt (an entity or a column row)."""

    @property
    def id(self) -> int: ...
    @property
    def worker_id(self) -> str | None: ...


def _resolve(session: Session, attempts: Sequence[_AttemptRef]) -> dict[int, str | None]:
    """attempt row id -> the instance its worker runs on, for attempts whose worker was
    not linked when they opened (three batched queries, whatever their number). Reads
    only: the caller decides whether to write the answer."""
    wids = sorted({a.worker_id for a in attempts if a.worker_id})
    if not wids:
        return {}
    workers = {
        w.id: w
        for ch in _chunks(wids)
        for w in session.execute(select(Worker.id, Worker.pool, Worker.instance_id).where(Worker.id.in_(ch)))
    }
    by_worker: dict[str, str] = {}
    for ch in _chunks(wids):
        for iid, wid in session.execute(select(Instance.id, Instance.worker_id).where(Instance.worker_id.in_(ch))):
            by_worker[str(wid)] = iid
    pids = sorted({w.instance_id for w in workers.values()})
    by_pid: dict[tuple[str, str | None], str] = {}
    for ch in _chunks(pids):
        stmt = (
            select(Instance.id, Instance.pool, Instance.provider_instance_id)
            .where(Instance.provider_instance_id.in_(ch))
            .order_by(Instance.created_at, Instance.id)
        )
        for iid, pool, pid in session.execute(stmt):
            by_pid[(pool, pid)] = iid  # the latest launch wins
    out: dict[int, str | None] = {}
    for a in attempts:
        if a.worker_id is None:
            continue
        w = workers.get(a.worker_id)
        found = by_pid.get((w.pool, w.instance_id)) if w is not None else None
        out[a.id] = found or by_worker.get(a.worker_id)
    return out


@dataclass
class _Held:
    """An attempt as `accrue` reads and extends it (a column row, not an entity)."""

    id: int
    team: str
    gpus: int
    started_at: datetime
    ended_at: datetime | None
    cost_usd: float
    gpu_hours: float
    link: str | None = None  # the instance a loose attempt was resolved to, to record
    changed: bool = False


@dataclass
class _Segment:
    """A spend record as `accrue` extends it; `id` None until it is inserted."""

    id: int | None
    end: datetime
    hours: float
    gpu_hours: float
    cost_usd: float
    changed: bool = False


_HELD_COLUMNS = (
    TaskAttempt.id,
    TaskAttempt.team,
    TaskAttempt.gpus,
    TaskAttempt.started_at,
    TaskAttempt.ended_at,
    TaskAttempt.cost_usd,
    TaskAttempt.gpu_hours,
)


def _held(session: Session, instance_ids: Sequence[str], conditions: Sequence[Any]) -> dict[str, list[_Held]]:
    """Attempts matching `conditions` on these instances, by instance id (linked ones by
    attempt id, then the loose ones resolved to one of them: attempts not yet linked
    to an instance are resolved here, and linked for good); a loose attempt carries
    the instance it is linked to (`link`)."""
    loose_rows = session.execute(
        select(*_HELD_COLUMNS, TaskAttempt.worker_id)
        .where(TaskAttempt.instance_id.is_(None), *conditions)
        .order_by(TaskAttempt.id)
    ).all()
    resolved = _resolve(session, loose_rows) if loose_rows else {}
    out: dict[str, list[_Held]] = defaultdict(list)
    for ch in _chunks(instance_ids):
        stmt = (
            select(TaskAttempt.instance_id, *_HELD_COLUMNS)
            .where(TaskAttempt.instance_id.in_(ch), *conditions)
            .order_by(TaskAttempt.id)
        )
        for r in session.execute(stmt):
            out[str(r.instance_id)].append(
                _Held(r.id, r.team, r.gpus, r.started_at, r.ended_at, r.cost_usd, r.gpu_hours)
            )
    wanted = set(instance_ids)
    for row in loose_rows:
        iid = resolved.get(row.id)
        if iid is None:
            continue
        held = _Held(row.id, row.team, row.gpus, row.started_at, row.ended_at, row.cost_usd, row.gpu_hours, iid, True)
        if iid in wanted:
            out[iid].append(held)
        else:
            _write_attempts(session, [held])  # linked for good, as the entity path did
    return out


def _write_attempts(session: Session, rows: Iterable[_Held]) -> None:
    """Store what `accrue` changed on attempts, one executemany per kind of change."""
    changed = [a for a in rows if a.changed]
    costs = [{"b_id": a.id, "b_cost": a.cost_usd, "b_gpu_h": a.gpu_hours} for a in changed]
    links = [{"b_id": a.id, "b_iid": a.link} for a in changed if a.link is not None]
    t = cast(Table, TaskAttempt.__table__)
    if links:
        session.execute(t.update().where(t.c.id == bindparam("b_id")).values(instance_id=bindparam("b_iid")), links)
    if costs:
        session.execute(
            t.update()
            .where(t.c.id == bindparam("b_id"))
            .values(cost_usd=bindparam("b_cost"), gpu_hours=bindparam("b_gpu_h")),
            costs,
        )


def accrue(session: Session, *, now: datetime, since: datetime | None = None, shared: Collection[str] = ()) -> int:
    """Bring the segments of every billed instance up to `now` (or its termination).

    Looks at instances still alive and those terminated since `since`; each is accrued
    from its watermark (the end of its latest segment) to now, using the attempts that
    overlap that window, so a cycle costs what changed since the last one, not history.
    Without `since` (first cycle after a start) the cutoff is the start of the previous
    month, so an instance that ended just before a month boundary while nothing accrued
    is still charged. `shared`: pools whose unused capacity goes to "shared". Returns
    the number of segments written or extended.

    It runs every cycle over the live fleet, so it reads column rows and writes with
    one executemany per table (no entities, no identity map): the arithmetic, and the
    order of the rows it inserts, are those of the entity version it replaced. Loaded
    attempt and spend entities in the caller's session are expired, so they re-read.
    """
    cutoff = since or month_bounds(month_bounds(now)[0] - timedelta(seconds=1))[0]
    instances = session.execute(
        select(
            Instance.id,
            Instance.gpus,
            Instance.hourly_price,
            Instance.team,
            Instance.pool,
            Instance.provider,
            Instance.region,
            Instance.instance_type,
            Instance.capacity_type,
            Instance.launched_at,
            Instance.terminated_at,
        ).where(
            Instance.launched_at.is_not(None),
            or_(Instance.terminated_at.is_(None), Instance.terminated_at >= cutoff),
        )
    ).all()
    if not instances:
        return 0
    ids = [inst.id for inst in instances]
    marks: dict[str, datetime] = {}
    for ch in _chunks(ids):
        stmt = (
            select(SpendRecord.instance_id, func.max(SpendRecord.end))
            .where(SpendRecord.instance_id.in_(ch))
            .group_by(SpendRecord.instance_id)
        )
        for iid, end in session.execute(stmt):
            marks[iid] = end
    windows: dict[str, tuple[Any, datetime, datetime]] = {}
    for inst in instances:
        assert inst.launched_at is not None
        lo = max(marks.get(inst.id, inst.launched_at), inst.launched_at)
        hi = min(inst.terminated_at or now, now)
        if hi > lo:
            windows[inst.id] = (inst, lo, hi)
    if not windows:
        return 0
    lo_all = min(w[1] for w in windows.values())
    hi_all = max(w[2] for w in windows.values())
    todo = sorted(windows)
    overlapping = (
        or_(TaskAttempt.ended_at.is_(None), TaskAttempt.ended_at > lo_all),
        TaskAttempt.started_at < hi_all,
    )
    attempts = _held(session, todo, overlapping)
    existing: dict[tuple[str, datetime, str, str], _Segment] = {}
    first_month = month_bounds(lo_all)[0]
    for ch in _chunks(todo):
        recs = select(
            SpendRecord.id,
            SpendRecord.instance_id,
            SpendRecord.start,
            SpendRecord.team,
            SpendRecord.kind,
            SpendRecord.end,
            SpendRecord.hours,
            SpendRecord.gpu_hours,
            SpendRecord.cost_usd,
        ).where(SpendRecord.instance_id.in_(ch), SpendRecord.start >= first_month)
        for rid, iid, rstart, rteam, rkind, rend, rhours, rgpu_h, rcost in session.execute(recs):
            existing[(iid, month_bounds(rstart)[0], rteam, rkind)] = _Segment(rid, rend, rhours, rgpu_h, rcost)
    inserts: list[dict[str, Any]] = []
    new_segments: list[_Segment] = []
    written = 0
    for iid in todo:
        inst, lo, hi = windows[iid]
        mine = attempts.get(iid, [])
        holds = [(a.started_at, a.ended_at or now, a.gpus) for a in mine]
        cur = lo
        while cur < hi:
            month_start, nxt = month_bounds(cur)
            seg_end = min(nxt, hi)
            shares, unused = split(inst.gpus, holds, cur, seg_end)
            lines: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
            for a, share in zip(mine, shares, strict=True):
                if share.machine_hours <= 0:
                    continue
                usd = share.machine_hours * inst.hourly_price
                a.cost_usd += usd
                a.gpu_hours += share.gpu_hours
                a.changed = True
                line = lines[(a.team, USAGE)]
                line[0] += share.machine_hours
                line[1] += share.gpu_hours
            if unused.machine_hours > 0 or not lines:
                line = lines[(_unused_team_of(inst.team, inst.pool, shared), UNUSED)]
                line[0] += unused.machine_hours
                line[1] += unused.gpu_hours
            for (team, kind), (hours, gpu_hours) in lines.items():
                key = (iid, month_start, team, kind)
                found = existing.get(key)
                if found is None:
                    found = _Segment(None, seg_end, 0.0, 0.0, 0.0)
                    existing[key] = found
                    new_segments.append(found)
                    inserts.append(
                        {
                            "instance_id": iid,
                            "team": team,
                            "pool": inst.pool,
                            "provider": inst.provider,
                            "region": inst.region,
                            "instance_type": inst.instance_type,
                            "capacity_type": inst.capacity_type,
                            "kind": kind,
                            "start": cur,
                            "hourly_price": inst.hourly_price,
                        }
                    )
                found.hours += hours
                found.gpu_hours += gpu_hours
                found.cost_usd += hours * inst.hourly_price
                found.end = max(found.end, seg_end)
                found.changed = True
                written += 1
            cur = seg_end
    _write_attempts(session, (a for rows in attempts.values() for a in rows))
    t = cast(Table, SpendRecord.__table__)
    updates = [
        {"b_id": r.id, "b_end": r.end, "b_hours": r.hours, "b_gpu_h": r.gpu_hours, "b_cost": r.cost_usd}
        for r in existing.values()
        if r.changed and r.id is not None
    ]
    if updates:
        session.execute(
            t.update()
            .where(t.c.id == bindparam("b_id"))
            .values(
                end=bindparam("b_end"),
                hours=bindparam("b_hours"),
                gpu_hours=bindparam("b_gpu_h"),
                cost_usd=bindparam("b_cost"),
            ),
            updates,
        )
    if inserts:
        for values, seg in zip(inserts, new_segments, strict=True):
            values.update(end=seg.end, hours=seg.hours, gpu_hours=seg.gpu_hours, cost_usd=seg.cost_usd)
        # In the order the segments were made: ids (and so any scan's order) as before.
        session.execute(insert(SpendRecord), inserts)
    _expire_loaded(session)
    return written


def _expire_loaded(session: Session) -> None:
    """Attempts and spend records the caller's session holds re-read what accrue wrote."""
    for obj in list(session.identity_map.values()):
        if isinstance(obj, TaskAttempt | SpendRecord):
            session.expire(obj)


# ---------------------------------------------------------------------- reading


def month_to_date(session: Session, month: datetime, team: str | None = None) -> dict[str, float]:
    """USD charged per team in the month containing `month` (as accrued so far)."""
    start, end = month_bounds(month)
    stmt = (
        select(SpendRecord.team, func.sum(SpendRecord.cost_usd))
        .where(SpendRecord.start >= start, SpendRecord.start < end)
        .group_by(SpendRecord.team)
    )
    if team:
        stmt = stmt.where(SpendRecord.team == team)
    return {t: float(v or 0.0) for t, v in session.execute(stmt)}


def by_month(session: Session, team: str | None = None) -> dict[str, dict[str, float]]:
    """team -> {YYYY-MM: USD} over every accrued month."""
    out: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stmt = select(SpendRecord.team, SpendRecord.start, SpendRecord.cost_usd)
    if team:
        stmt = stmt.where(SpendRecord.team == team)
    for t, start, usd in session.execute(stmt):
        out[t][month_of(start)] += float(usd)
    return {t: dict(m) for t, m in out.items()}


def burn_rate(session: Session, team: str | None = None, *, shared: Collection[str] = ()) -> dict[str, float]:
    """USD/h billed right now, per team, under the same attribution as `accrue`: each
    live billed machine's price split by the GPUs its tasks hold now, the rest to the
    launching team (or "shared")."""
    # Column rows, not entities: this runs every cycle over the whole live fleet and its
    # open attempts, and only reads them (ORM loading was most of its time).
    live = session.execute(
        select(Instance.id, Instance.gpus, Instance.hourly_price, Instance.team, Instance.pool).where(
            Instance.state.in_(BILLED_STATES),
            Instance.launched_at.is_not(None),
            Instance.terminated_at.is_(None),
        )
    ).all()
    out: dict[str, float] = defaultdict(float)
    if live:
        held = _open_holds(session, [i.id for i in live])
        for inst in live:
            mine = held.get(inst.id, [])
            capacity = float(inst.gpus) if inst.gpus > 0 else 1.0
            weights = [(t, _weight(inst.gpus, g)) for t, g in mine]
            total = sum(w for _, w in weights)
            denom = max(capacity, total)
            for t, w in weights:
                out[t] += inst.hourly_price * w / denom
            free = max(0.0, 1.0 - total / capacity)
            if free > 0 or not weights:
                out[_unused_team_of(inst.team, inst.pool, shared)] += inst.hourly_price * free
    if team:
        return {team: out.get(team, 0.0)}
    return dict(out)


def _open_holds(session: Session, instance_ids: Sequence[str]) -> dict[str, list[tuple[str, int]]]:
    """(team, GPUs) of the attempts open now on these instances, by instance id, in the
    order `_held` gives them (linked ones by attempt id, then the resolved loose ones):
    the burn is summed in that order. Read only: a loose attempt is linked by `accrue`."""
    open_now = TaskAttempt.ended_at.is_(None)
    loose = session.execute(
        select(TaskAttempt.id, TaskAttempt.worker_id, TaskAttempt.team, TaskAttempt.gpus)
        .where(TaskAttempt.instance_id.is_(None), open_now)
        .order_by(TaskAttempt.id)
    ).all()
    resolved = _resolve(session, loose) if loose else {}
    out: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for ch in _chunks(instance_ids):
        stmt = (
            select(TaskAttempt.instance_id, TaskAttempt.team, TaskAttempt.gpus)
            .where(TaskAttempt.instance_id.in_(ch), open_now)
            .order_by(TaskAttempt.id)
        )
        for iid, team, gpus in session.execute(stmt):
            out[str(iid)].append((team, gpus))
    wanted = set(instance_ids)
    for a in loose:
        found = resolved.get(a.id)
        if found is not None and found in wanted:
            out[found].append((a.team, a.gpus))
    return out


def forecast(month_to_date_usd: float, burn_usd_per_hour: float, now: datetime, period_end: datetime) -> float:
    """Month-end projection: what is spent plus the current burn until the month ends."""
    hours_left = max((period_end - now).total_seconds(), 0.0) / 3600.0
    return month_to_date_usd + burn_usd_per_hour * hours_left


@dataclass(frozen=True)
class TeamSpend:
    team: str
    month: str
    month_to_date_usd: float
    burn_rate_usd_per_hour: float
    forecast_usd: float


@dataclass(frozen=True)
class Figures:
    """One month's money per team, computed once and shown everywhere."""

    month: str
    start: datetime
    end: datetime
    current: bool
    month_to_date: dict[str, float] = field(default_factory=dict)
    burn: dict[str, float] = field(default_factory=dict)

    def forecast(self, team: str, now: datetime) -> float:
        spent = self.month_to_date.get(team, 0.0)
        return forecast(spent, self.burn.get(team, 0.0), now, self.end) if self.current else spent

    def teams(self) -> list[str]:
        return sorted(set(self.month_to_date) | {t for t, v in self.burn.items() if v > 0})


def figures(
    session: Session,
    *,
    now: datetime,
    month: str | None = None,
    team: str | None = None,
    shared: Collection[str] = (),
) -> Figures:
    """Month-to-date and (for the current month) burn per team."""
    start, end = parse_month(month) if month else month_bounds(now)
    current = start <= now < end
    return Figures(
        month=f"{start:%Y-%m}",
        start=start,
        end=end,
        current=current,
        month_to_date=month_to_date(session, start, team),
        burn=burn_rate(session, team, shared=shared) if current else {},
    )


def spend_report(
    session: Session,
    *,
    now: datetime,
    month: str | None = None,
    team: str | None = None,
    shared: Collection[str] = (),
) -> list[TeamSpend]:
    """Per team: month-to-date, burn rate and forecast. A past month's forecast is its total."""
    fig = figures(session, now=now, month=month, team=team, shared=shared)
    teams = sorted(set(fig.teams()) | ({team} if team else set()))
    return [
        TeamSpend(
            team=t,
            month=fig.month,
            month_to_date_usd=round(fig.month_to_date.get(t, 0.0), 4),
            burn_rate_usd_per_hour=round(fig.burn.get(t, 0.0), 4),
            forecast_usd=round(fig.forecast(t, now), 4),
        )
        for t in teams
    ]


def segments(session: Session, month: str | datetime, team: str | None = None) -> list[SpendRecord]:
    """Every segment of a month (FOCUS-like rows for exports), oldest first."""
    start, end = parse_month(month) if isinstance(month, str) else month_bounds(month)
    stmt = select(SpendRecord).where(SpendRecord.start >= start, SpendRecord.start < end)
    if team:
        stmt = stmt.where(SpendRecord.team == team)
    return list(session.scalars(stmt.order_by(SpendRecord.start, SpendRecord.id)))
