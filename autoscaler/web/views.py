"""Read models behind the dashboard pages, each scoped to what the viewer may see.

`team=None` means an admin (everything); a team name restricts every query to that
team's tasks, instances, spend and history, the same rule the API applies.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.config import CapacityConfig
from autoscaler.ledger import reclaims as ledger_reclaims
from autoscaler.lifecycle import INSTANCE_LISTED, TASK_ACTIVE, TASK_ATTEMPT_ENDED, WORKER_LIVE
from autoscaler.queueing.queues import queue_stats, visible_queues
from autoscaler.queueing.states import TaskState
from autoscaler.reconciler.team_view import team_lines, verdict
from autoscaler.state.models import (
    DecisionRecord,
    HistoryPoint,
    Instance,
    SpendRecord,
    Task,
    TaskEvent,
    TaskLog,
    Worker,
)
from autoscaler.web.charts import Series

LIVE_INSTANCE_STATES = INSTANCE_LISTED
# How the overview groups instance states into the three columns people watch.
FLEET_COLUMNS = {
    "requested": "launching",
    "launching": "launching",
    "booting": "launching",
    "ready": "ready",
    "draining": "draining",
    "terminating": "draining",
}
FINAL_EVENT_STATES = TASK_ATTEMPT_ENDED
ACTIVE_EVENT_STATES = TASK_ACTIVE
# History written per worker by the reconciler (key = worker id), for sparklines.
WORKER_GPU_METRIC = "worker_gpu_utilization_pct"
CHART_TITLES = {
    "queue_depth": "Queue depth (tasks waiting)",
    "fleet_instances": "Fleet size (instances by pool/state)",
    "spend_mtd_usd": "Spend month-to-date (USD)",
    "burn_usd_per_hour": "Burn rate (USD/h)",
}
# Sampled counts and rates: each holds until the next sample (drawn as steps). Spend
# month-to-date accrues continuously, so a slope between samples is true there.
STEP_METRICS = frozenset({"queue_depth", "fleet_instances", "burn_usd_per_hour"})
# Series keyed by team name, the only history a team member is shown: queue and
# fleet series mix every team's work.
TEAM_METRICS = ("spend_mtd_usd", "burn_usd_per_hour")


@dataclass(frozen=True)
class QueueRowView:
    name: str
    depth: int
    running: int
    oldest_wait_s: float | None


def queues(session: Session, team: str | None, now: datetime) -> list[QueueRowView]:
    stats = queue_stats(session, team=team)
    out = []
    for row in visible_queues(session, team):
        st = stats.get(row.name)
        wait = (now - st.oldest_enqueued).total_seconds() if st and st.oldest_enqueued else None
        out.append(QueueRowView(row.name, st.depth if st else 0, st.running if st else 0, wait))
    return out


@dataclass
class FleetGroup:
    provider: str
    pool: str
    capacity_type: str
    launching: int = 0
    ready: int = 0
    draining: int = 0


def fleet_groups(session: Session, team: str | None) -> list[FleetGroup]:
    stmt = (
        select(Instance.provider, Instance.pool, Instance.capacity_type, Instance.state, func.count())
        .where(Instance.state.in_(LIVE_INSTANCE_STATES))
        .group_by(Instance.provider, Instance.pool, Instance.capacity_type, Instance.state)
    )
    if team is not None:
        stmt = stmt.where(Instance.team == team)
    groups: dict[tuple[str, str, str], FleetGroup] = {}
    for provider, pool, capacity, state, n in session.execute(stmt):
        g = groups.setdefault((provider, pool, capacity), FleetGroup(provider, pool, capacity))
        column = FLEET_COLUMNS[state]
        setattr(g, column, getattr(g, column) + n)
    return [groups[k] for k in sorted(groups)]


@dataclass(frozen=True)
class ReclaimRow:
    offering: str
    rate: float
    sd: float
    hours: float
    reclaims: float


def reclaim_rates(session: Session, capacity: CapacityConfig, now: datetime) -> list[ReclaimRow]:
    """Each spot offering's observed reclaim rate (a fleet figure naming no team)."""
    if not capacity.enabled:
        return []
    found = ledger_reclaims.reclaim_rates(session, capacity, now=now)
    return [ReclaimRow(k, e.rate, e.sd, e.hours, e.reclaims) for k, e in sorted(found.items())]


def tasks(
    session: Session,
    team: str | None,
    *,
    queue: str | None,
    state: str | None,
    team_filter: str | None,
    limit: int,
) -> list[Task]:
    stmt = select(Task).order_by(Task.created_at.desc(), Task.id).limit(limit)
    if team is not None:
        stmt = stmt.where(Task.team == team)
    elif team_filter:
        stmt = stmt.where(Task.team == team_filter)
    if queue:
        stmt = stmt.where(Task.queue == queue)
    if state:
        stmt = stmt.where(Task.state == state)
    return list(session.scalars(stmt))


@dataclass
class Attempt:
    number: int
    worker_id: str | None = None
    started: datetime | None = None
    ended: datetime | None = None
    outcome: str | None = None
    end_reason: str | None = None
    detail: str = ""
    events: list[TaskEvent] = field(default_factory=list)
    logs: str = ""


def task_detail(session: Session, team: str | None, task_id: str) -> tuple[Task, list[Attempt]] | None:
    task = session.get(Task, task_id) if len(task_id) <= 64 else None
    if task is None or (team is not None and task.team != team):
        return None
    attempts: dict[int, Attempt] = {}
    for ev in session.scalars(select(TaskEvent).where(TaskEvent.task_id == task.id).order_by(TaskEvent.id)):
        a = attempts.setdefault(ev.attempt, Attempt(ev.attempt))
        a.events.append(ev)
        a.worker_id = ev.worker_id or a.worker_id
        if ev.to_state == TaskState.LEASED.value and a.started is None:
            a.started = ev.at
        if ev.to_state in FINAL_EVENT_STATES:
            a.ended, a.outcome, a.end_reason, a.detail = ev.at, ev.to_state, ev.reason, ev.detail
        elif ev.to_state == TaskState.QUEUED.value and ev.from_state in ACTIVE_EVENT_STATES:
            # A failed attempt with attempts left goes straight back to the queue.
            a.ended, a.outcome, a.end_reason, a.detail = ev.at, "failed", ev.reason, ev.detail
    # The last 500 chunks are plenty for a page; the CLI streams the whole log.
    chunks = list(
        session.scalars(select(TaskLog).where(TaskLog.task_id == task.id).order_by(TaskLog.id.desc()).limit(500))
    )
    for chunk in reversed(chunks):
        attempts.setdefault(chunk.attempt, Attempt(chunk.attempt)).logs += chunk.data
    return task, [attempts[k] for k in sorted(attempts)]


@dataclass(frozen=True)
class InstanceView:
    instance: Instance
    uptime_s: float
    cost_usd: float
    cost_estimated: bool
    worker: Worker | None
    gpu_util: list[float]


def instances(session: Session, team: str | None, now: datetime, *, include_terminated: bool) -> list[InstanceView]:
    stmt = select(Instance).order_by(Instance.created_at.desc()).limit(500)
    if team is not None:
        stmt = stmt.where(Instance.team == team)
    if not include_terminated:
        stmt = stmt.where(Instance.state.in_(LIVE_INSTANCE_STATES))
    rows = list(session.scalars(stmt))
    if not rows:
        return []
    ids = [r.id for r in rows]
    recorded = dict(
        session.execute(
            select(SpendRecord.instance_id, func.sum(SpendRecord.cost_usd))
            .where(SpendRecord.instance_id.in_(ids))
            .group_by(SpendRecord.instance_id)
        ).all()
    )
    keys = ids + [r.provider_instance_id for r in rows if r.provider_instance_id]
    workers: dict[str, Worker] = {}
    for w in session.scalars(select(Worker).where(Worker.instance_id.in_(keys)).order_by(Worker.registered_at)):
        workers[w.instance_id] = w  # the latest registration wins
    util = gpu_history(session, [w.id for w in workers.values()], now)
    out = []
    for r in rows:
        began = r.launched_at or r.created_at
        uptime = max(0.0, ((r.terminated_at or now) - began).total_seconds())
        cost = recorded.get(r.id)
        worker = workers.get(r.id) or (workers.get(r.provider_instance_id) if r.provider_instance_id else None)
        samples = util.get(worker.id, []) if worker else []
        if not samples and worker is not None and worker.gpu_metrics:
            samples = [float(sum(g.get("utilization_pct", 0) for g in worker.gpu_metrics) / len(worker.gpu_metrics))]
        out.append(
            InstanceView(
                instance=r,
                uptime_s=uptime,
                cost_usd=float(cost) if cost is not None else r.hourly_price * uptime / 3600.0,
                cost_estimated=cost is None,
                worker=worker,
                gpu_util=samples,
            )
        )
    return out


def gpu_history(session: Session, worker_ids: list[str], now: datetime) -> dict[str, list[float]]:
    if not worker_ids:
        return {}
    out: dict[str, list[float]] = defaultdict(list)
    for key, value in session.execute(
        select(HistoryPoint.key, HistoryPoint.value)
        .where(
            HistoryPoint.metric == WORKER_GPU_METRIC,
            HistoryPoint.key.in_(worker_ids),
            HistoryPoint.at >= now - timedelta(hours=1),
        )
        .order_by(HistoryPoint.at)
    ):
        out[key].append(float(value))
    return out


def unattached_workers(session: Session, team: str | None) -> list[Worker]:
    """Live workers with no instance row (on-prem machines, local agents): operators only."""
    if team is not None:
        return []
    known = select(Instance.id).union(
        select(Instance.provider_instance_id).where(Instance.provider_instance_id.is_not(None))
    )
    return list(
        session.scalars(
            select(Worker)
            .where(Worker.state.in_(WORKER_LIVE), Worker.instance_id.not_in(known))
            .order_by(Worker.registered_at.desc())
            .limit(200)
        )
    )


@dataclass(frozen=True)
class DecisionView:
    record: DecisionRecord
    reasons: list[str]
    plan: list[str]  # what the cycle planned, in words ("launch 2 machines")
    team_decision: dict[str, Any] | None
    # The team's standing in plain words ("may grow" only when it may); None for admins.
    verdict: str | None = None
    # Older cycles that said exactly the same (collapsed into this entry), and the
    # time of the oldest of them.
    repeats: int = 0
    since: datetime | None = None

    def said(self) -> tuple[Any, ...]:
        return (tuple(self.reasons), tuple(self.plan), self.verdict, self.record.error, self.record.policy_revision)


def _reason_text(reason: Any) -> str:
    if isinstance(reason, str):
        return reason
    if isinstance(reason, dict):
        text = reason.get("message") or reason.get("text") or reason.get("reason")
        prefix = f"{reason['team']}: " if reason.get("team") else ""
        return prefix + str(text) if text else json.dumps(reason, sort_keys=True, default=str)
    return str(reason)


# The plan's parts in words: (singular, plural) of what a count of them is. "launch"
# and "drain" are the short keys of early records.
PLAN_WORDS = {
    "launches": ("launch {n} machine", "launch {n} machines"),
    "launch": ("launch {n} machine", "launch {n} machines"),
    "drains": ("drain {n} idle or unneeded worker", "drain {n} idle or unneeded workers"),
    "drain": ("drain {n} idle or unneeded worker", "drain {n} idle or unneeded workers"),
    "terminations": ("terminate {n} machine", "terminate {n} machines"),
    "holds": ("keep {n} group of tasks waiting", "keep {n} groups of tasks waiting"),
    "placed_on_existing": ("place {n} task on running machines", "place {n} tasks on running machines"),
}


def _plan_words(plan: dict[str, Any]) -> list[str]:
    """What a plan does, in words. A record keeps at most a few items of each list and
    their full count under `<key>_count`: the count wins, and is never shown itself."""
    out = []
    for key, value in plan.items():
        if key.endswith("_count") or key == "notes":
            continue
        n = plan.get(f"{key}_count")
        if not isinstance(n, int):
            n = (
                len(value)
                if isinstance(value, list | dict)
                else (value if isinstance(value, int) else int(bool(value)))
            )
        if not n:
            continue
        one, many = PLAN_WORDS.get(key, (f"{key.replace('_', ' ')}: {{n}}", f"{key.replace('_', ' ')}: {{n}}"))
        out.append((one if n == 1 else many).format(n=n))
    for key, n in plan.items():  # a lean record keeps counts only
        base = key.removesuffix("_count")
        if key.endswith("_count") and base not in plan and isinstance(n, int) and n:
            one, many = PLAN_WORDS.get(base, (f"{base.replace('_', ' ')}: {{n}}", f"{base.replace('_', ' ')}: {{n}}"))
            out.append((one if n == 1 else many).format(n=n))
    return out


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))


def collapse(views: list[DecisionView]) -> list[DecisionView]:
    """Consecutive cycles that said the same thing become one entry with a count: a
    steady state (the same warning every 15 s) is one line, not a page of them."""
    out: list[DecisionView] = []
    for v in views:  # newest first
        if out and out[-1].said() == v.said():
            out[-1] = replace(out[-1], repeats=out[-1].repeats + 1, since=v.record.at)
        else:
            out.append(v)
    return out


def decisions(session: Session, team: str | None, limit: int, now_verdict: str | None = None) -> list[DecisionView]:
    """The last decisions; for a team, its part of each. `now_verdict` (the team's
    current admission in words) replaces what the latest decision said about it:
    the admission is what the gates enforce now."""
    rows = session.scalars(select(DecisionRecord).order_by(DecisionRecord.id.desc()).limit(limit))
    out: list[DecisionView] = []
    for r in rows:
        if team is None:
            out.append(
                DecisionView(r, _unique([_reason_text(x) for x in r.reasons or []]), _plan_words(r.plan or {}), None)
            )
            continue
        # A team sees the policy's word about itself, never the fleet-wide figures.
        mine = [_reason_text(x) for x in r.reasons or [] if isinstance(x, dict) and x.get("team") == team]
        plan = r.plan or {}
        mine += [line for line in team_lines(r.result or {}, plan, team) if not line.startswith(f"team {team}:")]
        said = ((r.result or {}).get("teams") or {}).get(team)
        words = now_verdict if (now_verdict is not None and not out) else verdict(r.result or {}, plan, team)
        out.append(DecisionView(r, _unique(mine), [], said if isinstance(said, dict) else None, words))
    return collapse(out)


def history(session: Session, team: str | None, now: datetime, hours: int) -> dict[str, list[Series]]:
    """Metric -> one series per key over the last `hours`; a team sees only its own team-keyed series."""
    stmt = (
        select(HistoryPoint.metric, HistoryPoint.key, HistoryPoint.at, HistoryPoint.value)
        .where(HistoryPoint.at >= now - timedelta(hours=hours), HistoryPoint.metric != WORKER_GPU_METRIC)
        .order_by(HistoryPoint.metric, HistoryPoint.key, HistoryPoint.at)
        .limit(50_000)
    )
    if team is not None:
        stmt = stmt.where(HistoryPoint.key == team, HistoryPoint.metric.in_(TEAM_METRICS))
    grouped: dict[str, dict[str, list[tuple[datetime, float]]]] = defaultdict(lambda: defaultdict(list))
    for metric, key, at, value in session.execute(stmt):
        grouped[metric][key or "total"].append((at, float(value)))
    ordered = sorted(
        grouped,
        key=lambda m: (m not in CHART_TITLES, list(CHART_TITLES).index(m) if m in CHART_TITLES else 0, m),
    )
    return {m: [Series(k, pts) for k, pts in sorted(grouped[m].items())] for m in ordered}
