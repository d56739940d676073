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

from autoscaler.auth import security
from autoscaler.config import CapacityConfig
from autoscaler.ledger.reclaims import reclaim_rates
from autoscaler.lifecycle import INSTANCE_LISTED, WORKER_LIVE, InstanceState
from autoscaler.notify.deliver import delivery_counts
from autoscaler.queueing.queues import queue_stats, visible_queues
from autoscaler.reports.spend import TeamSpend
from autoscaler.state.models import DecisionRecord, Instance, InstanceEvent, Task, TaskEvent, Worker

LIVE_INSTANCE_STATES = INSTANCE_LISTED
LIVE_WORKER_STATES = WORKER_LIVE


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
    # Spot reclaims, from the instances' history (so the count survives restarts): every
    # cloud's, whether the agent's notice or the provider's listing or events told us.
    preemptions = CounterMetricFamily(
        "autoscaler_instance_preemptions", "Instances reclaimed by their provider (spot).", labels=["provider", "pool"]
    )
    pre_stmt = (
        select(Instance.provider, Instance.pool, func.count())
        .select_from(InstanceEvent)
        .join(Instance, Instance.id == InstanceEvent.instance_id)
        .where(InstanceEvent.to_state == "preempted")
        .group_by(Instance.provider, Instance.pool)
    )
    if team is not None:
        pre_stmt = pre_stmt.where(Instance.team == team)
    for provider, pool, n in session.execute(pre_stmt):
        preemptions.add_metric([provider, pool], n)
    yield preemptions
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


# Transitions counted for the shipped alerting rules (deploy/prometheus/): launches
# (booting = the provider returned an instance), refusals, boot timeouts, losses.
_I = InstanceState
COUNTED_TRANSITIONS = (_I.LAUNCHING, _I.BOOTING, _I.LAUNCH_FAILED, _I.BOOT_TIMEOUT, _I.LOST, _I.PREEMPTED)


def _lifecycle_families(session: Session, now: datetime, team: str | None) -> Iterator[Metric]:
    """Instance lifecycle counters (from the event history, so they survive restarts
    and agree across API processes) and the age of the oldest machine still booting."""
    transitions = CounterMetricFamily(
        "autoscaler_instance_transitions",
        "Instance state changes by pool and new state (launching, booting = launched, launch_failed, "
        "boot_timeout, lost, preempted).",
        labels=["pool", "state"],
    )
    stmt = (
        select(Instance.pool, InstanceEvent.to_state, func.count())
        .join(Instance, Instance.id == InstanceEvent.instance_id)
        .where(InstanceEvent.to_state.in_(COUNTED_TRANSITIONS))
        .group_by(Instance.pool, InstanceEvent.to_state)
    )
    if team is not None:
        stmt = stmt.where(Instance.team == team)
    for pool, state, n in session.execute(stmt):
        transitions.add_metric([pool, state], n)
    yield transitions
    booting = GaugeMetricFamily(
        "autoscaler_instance_oldest_booting_seconds",
        "Per pool, how long the oldest machine still booting (launched, agent not registered) has been up.",
        labels=["pool"],
    )
    boot_stmt = (
        select(Instance.pool, func.min(func.coalesce(Instance.launched_at, Instance.updated_at)))
        .where(Instance.state == "booting")
        .group_by(Instance.pool)
    )
    if team is not None:
        boot_stmt = boot_stmt.where(Instance.team == team)
    for pool, since in session.execute(boot_stmt):
        if since is not None:
            booting.add_metric([pool], max(0.0, (now - since).total_seconds()))
    yield booting


def _security_families(session: Session) -> Iterator[Metric]:
    """Security events from the database (every API process's), for admins only."""
    seen = {(k, tk): n for k, tk, n in security.counts(session)}
    events = CounterMetricFamily(
        "autoscaler_security_events",
        "Security events: refused registrations, token replays, authorization failures, by kind and token kind.",
        labels=["kind", "token_kind"],
    )
    for kind in security.KINDS:  # every kind has a series from the start, so rate() alerts work
        if not any(k == kind for k, _ in seen):
            events.add_metric([kind, ""], 0)
    for (kind, token_kind), n in sorted(seen.items()):
        events.add_metric([kind, token_kind], n)
    yield events
    per_token = CounterMetricFamily(
        "autoscaler_token_security_events",
        "Security events per recognised token (by token id, never the token), the 200 with most events.",
        labels=["token_id", "token_kind"],
    )
    for token_id, token_kind, n in security.failures_by_token(session):
        per_token.add_metric([token_id, token_kind], n)
    yield per_token


def _spend_families(spend: Iterable[TeamSpend]) -> Iterator[Metric]:
    mtd = GaugeMetricFamily("autoscaler_team_spend_usd", "Month-to-date spend per team (USD).", labels=["team"])
    burn = GaugeMetricFamily(
        "autoscaler_team_burn_usd_per_hour",
        "USD per hour billed to the team now: its tasks' share of machines plus free capacity it launched.",
        labels=["team"],
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


def _alert_families(session: Session, team: str | None) -> Iterator[Metric]:
    deliveries = GaugeMetricFamily(
        "autoscaler_alert_deliveries",
        "Alert deliveries by channel and status (pending, delivered, failed).",
        labels=["channel", "status"],
    )
    for (channel, status), n in sorted(delivery_counts(session, team).items()):
        deliveries.add_metric([channel, status], n)
    yield deliveries


def _reclaim_families(session: Session, now: datetime, capacity: CapacityConfig) -> Iterator[Metric]:
    """Each spot offering's observed reclaim rate (ledger.reclaims): a fleet figure that
    names no team, so every viewer sees it."""
    labels = ["offering", "instance_type", "zone"]
    rate = GaugeMetricFamily(
        "autoscaler_spot_reclaim_rate", "Estimated spot reclaims per instance-hour, per offering.", labels=labels
    )
    sd = GaugeMetricFamily(
        "autoscaler_spot_reclaim_rate_sd", "Standard deviation of the reclaim-rate estimate.", labels=labels
    )
    # Prometheus names carry base units: the instance-hours are exported as seconds.
    seconds = GaugeMetricFamily(
        "autoscaler_spot_instance_seconds",
        "Spot instance time observed (instance-seconds), after decay, per offering.",
        labels=labels,
    )
    reclaims = GaugeMetricFamily(
        "autoscaler_spot_reclaims", "Spot reclaims observed, after decay, per offering.", labels=labels
    )
    for key, est in sorted(reclaim_rates(session, capacity, now=now).items()):
        _, itype, zone = key.split("/", 2)
        values = [key, itype, zone]
        rate.add_metric(values, est.rate)
        sd.add_metric(values, est.sd)
        seconds.add_metric(values, est.hours * 3600.0)
        reclaims.add_metric(values, est.reclaims)
    yield from (rate, sd, seconds, reclaims)


def snapshot_families(
    session: Session,
    *,
    now: datetime,
    spend: list[TeamSpend],
    team: str | None,
    capacity: CapacityConfig | None = None,
) -> list[Metric]:
    return [
        *(_reclaim_families(session, now, capacity) if capacity is not None and capacity.enabled else ()),
        *_queue_families(session, now, team),
        *_task_families(session, team),
        *_fleet_families(session, team),
        *_lifecycle_families(session, now, team),
        *_spend_families(spend),
        *_alert_families(session, team),
        *(_security_families(session) if team is None else ()),
    ]
