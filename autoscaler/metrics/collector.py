"""Metrics read from the database at scrape time: a few grouped counts per scrape.

`snapshot_families(session, ...)` returns Prometheus metric families scoped to a
team when one is given: a team sees its own queues' figures (its own tasks only),
its tasks, its instances and its spend, nothing of other teams.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoscaler.queueing.queues import queue_stats, visible_queues
from autoscaler.reports.spend import TeamSpend
from autoscaler.state.models import DecisionRecord, Instance, Task, TaskEvent, Worker

LIVE_INSTANCE_STATES = ("requested", "launching", "booting", "ready", "draining", "terminating")
LIVE_WORKER_STATES = ("idle", "busy", "draining")


def _queue_families(session: Session, now: datetime, team: str | None) -> Iterator[Metric]:
    depth = GaugeMetricFamily("autoscaler_queue_depth", "Tasks queued and not yet leased.", labels=["queue"])
    running = GaugeMetricFamily("autoscaler_queue_running", "Tasks leased or running.", labels=["queue"])
    oldest = GaugeMetricFamily(
        "autoscaler_queue_oldest_wait_seconds",
        "Age of the oldest queued task (0 when empty).",
        labels=["queue"],
    )
    stats = queue_stats(session, team=team)
    for row in visible_queues(session, team):
        st = stats.get(row.name)
        depth.add_metric([row.name], st.depth if st else 0)
        running.add_metric([row.name], st.running if st else 0)
        wait = (now - st.oldest_enqueued).total_seconds() if st and st.oldest_enqueued else 0.0
        oldest.add_metric([row.name], max(0.0, wait))
    yield from (depth, running, oldest)


def _task_families(session: Session, team: str | None) -> Iterator[Metric]:
    tasks = GaugeMetricFamily("autoscaler_tasks", "Tasks by team and state.", labels=["team", "state"])
    stmt = select(Task.team, Task.state, func.count()).group_by(Task.team, Task.state)
    if team is not None:
        stmt = stmt.where(Task.team == team)
    for t, state, n in session.execute(stmt):
        tasks.add_metric([t, state], n)
    yield tasks
    # Every lease is a history row, so the counter survives restarts and counts the
    # leases of every API process; `rate()` of it is leases per second.
    leases = CounterMetricFamily("autoscaler_task_leases", "Tasks leased by workers (attempts started).")
    lease_stmt = select(func.count()).select_from(TaskEvent).where(TaskEvent.to_state == "leased")
    if team is not None:
        lease_stmt = lease_stmt.join(Task, Task.id == TaskEvent.task_id).where(Task.team == team)
    leases.add_metric([], session.scalar(lease_stmt) or 0)
    yield leases


def _fleet_families(session: Session, team: str | None) -> Iterator[Metric]:
    instances = GaugeMetricFamily(
        "autoscaler_instances",
        "Live instances by provider, pool, capacity type and state.",
        labels=["provider", "pool", "capacity_type", "state"],
    )
    stmt = (
        select(Instance.provider, Instance.pool, Instance.capacity_type, Instance.state, func.count())
        .where(Instance.state.in_(LIVE_INSTANCE_STATES))
        .group_by(Instance.provider, Instance.pool, Instance.capacity_type, Instance.state)
    )
    if team is not None:
        stmt = stmt.where(Instance.team == team)
    for provider, pool, capacity, state, n in session.execute(stmt):
        instances.add_metric([provider, pool, capacity, state], n)
    yield instances
    if team is not None:
        return  # workers carry no team; shared machines are the operators' view
    workers = GaugeMetricFamily("autoscaler_workers", "Live workers by pool and state.", labels=["pool", "state"])
    for pool, state, n in session.execute(
        select(Worker.pool, Worker.state, func.count())
        .where(Worker.state.in_(LIVE_WORKER_STATES))
        .group_by(Worker.pool, Worker.state)
    ):
        workers.add_metric([pool, state], n)
    yield workers
    last = session.execute(
        select(DecisionRecord.at, DecisionRecord.cycle_ms, DecisionRecord.error)
        .order_by(DecisionRecord.id.desc())
        .limit(1)
    ).first()
    if last is not None:
        yield GaugeMetricFamily(
            "autoscaler_policy_fail_safe",
            "1 while the last cycle's policy could not be evaluated (holding: nothing launched).",
            value=1.0 if last[2] else 0.0,
        )
        yield GaugeMetricFamily(
            "autoscaler_last_decision_timestamp_seconds",
            "When the last reconcile cycle was recorded.",
            value=last[0].timestamp(),
        )
        yield GaugeMetricFamily(
            "autoscaler_last_reconcile_cycle_seconds",
            "Duration of the last recorded reconcile cycle.",
            value=last[1] / 1000.0,
        )


def _spend_families(spend: Iterable[TeamSpend]) -> Iterator[Metric]:
    mtd = GaugeMetricFamily("autoscaler_team_spend_usd", "Month-to-date spend per team (USD).", labels=["team"])
    burn = GaugeMetricFamily(
        "autoscaler_team_burn_usd_per_hour", "Hourly price of the team's live capacity.", labels=["team"]
    )
    forecast = GaugeMetricFamily(
        "autoscaler_team_spend_forecast_usd", "Month-end spend forecast per team (USD).", labels=["team"]
    )
    budget = GaugeMetricFamily("autoscaler_team_budget_usd", "Monthly budget per team (USD).", labels=["team"])
    ratio = GaugeMetricFamily(
        "autoscaler_team_budget_ratio",
        "Month-to-date spend over monthly budget (1 = all spent).",
        labels=["team"],
    )
    forecast_ratio = GaugeMetricFamily(
        "autoscaler_team_forecast_budget_ratio", "Forecast over monthly budget.", labels=["team"]
    )
    for t in spend:
        mtd.add_metric([t.team], t.month_to_date_usd)
        burn.add_metric([t.team], t.burn_usd_per_hour)
        forecast.add_metric([t.team], t.forecast_usd)
        if t.budget_usd is not None and t.ratio is not None and t.forecast_ratio is not None:
            budget.add_metric([t.team], t.budget_usd)
            ratio.add_metric([t.team], t.ratio)
            forecast_ratio.add_metric([t.team], t.forecast_ratio)
    yield from (mtd, burn, forecast, budget, ratio, forecast_ratio)


class SnapshotCollector(Collector):
    """The families computed for one scrape, handed to a throwaway registry."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def snapshot_families(session: Session, *, now: datetime, spend: list[TeamSpend], team: str | None) -> list[Metric]:
    return [
        *_queue_families(session, now, team),
        *_task_families(session, team),
        *_fleet_families(session, team),
        *_spend_families(spend),
    ]
