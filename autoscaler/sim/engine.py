"""The discrete-event loop: trace arrivals, boots, task completions, drain deadlines,
spot notices and reclaims on a heap of virtual times, and the REAL `Reconciler.run_cycle`
(observe -> policy -> plan -> act -> record) whenever something changed, at most once
per reconcile interval of virtual time.

Nothing here decides what to launch, drain or terminate: the reconciler does, against
the fake provider (which stands for the cloud) and a database the simulated agents
share with it. The simulator only plays the world: how long a boot takes, when a spot
machine is reclaimed, how long a task runs.

Gangs (trace jobs wider than a machine, enqueued with `nodes=N`) go through the same
queueing code as a real agent's: a lease may only reserve a rank (the worker's GPUs
are held, nothing starts); the lease that reserves the N-th rank starts it, and every
other rank's worker starts on its next lease, at the same virtual instant (a real agent
holding a reservation asks every 0.25 s). When one rank ends otherwise than exit 0
(spot, drain, a terminated machine) the server tells the others to stop, and their
agents report so at once; the gang is requeued as one. A partial reservation is
released by whichever lease comes after `gangs.reservation_timeout_s`: each reserving
gang gets a timer just past it, at which its agents ask again.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, PoolConfig
from autoscaler.ledger.period import month_bounds
from autoscaler.lifecycle import TASK_FINAL
from autoscaler.planner.warm_pool import WARM_FLOOR_S
from autoscaler.policy.schema import EvaluationResult, PolicyEngine, PolicyInput
from autoscaler.provisioning import catalog_offerings
from autoscaler.queueing import gangs
from autoscaler.queueing import tasks as task_ops
from autoscaler.queueing.queues import sync_from_config
from autoscaler.reconciler.cycle import CycleResult, Reconciler
from autoscaler.sim.agents import AgentOps, Leased, Reserved, RunningTask, SimAgent
from autoscaler.sim.budgets import read_budgets
from autoscaler.sim.whatif import checkpoint_every_s, checkpointing_keys
from autoscaler.sim.workload import TraceTask, Workload
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, Worker, seeded_ids
from providers.base import Provider
from providers.fake import FakeProvider

SIM_START = datetime(2026, 1, 1, tzinfo=UTC)
# Spot notice per cloud (shared/data/README.md): AWS 2 min, GCP and Azure 30 s.
NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
# How soon an agent holding a gang reservation asks again (the real agent's GANG_LEASE_S).
GANG_POLL_S = 0.25


class Ev(IntEnum):
    # Order breaks ties at equal times: the world moves before agents react to it.
    PREEMPT = 0
    ARRIVE = 1
    REGISTER = 2
    FINISH = 3
    DEADLINE = 4
    WAKE = 5


@dataclass(frozen=True)
class SimSettings:
    seed: int = 0
    # Boot to registered: uniform in this range (baked image: 1-5 min).
    boot_delay_s: tuple[float, float] = (60.0, 300.0)
    # Spot reclaims per instance-hour, per zone; zones not listed use `preemption_per_hour`.
    # SkyPilot's traces: 41-60 reclaims per zone in ~7 days for one node (0.24-0.36/h).
    preemption_per_hour: float = 0.24
    preemption_by_zone: Mapping[str, float] = field(default_factory=dict)
    notice_s: float | None = None  # None: per the pool's cloud (`NOTICE_S`), else 120 s
    # Tests: reclaim the first spot instance exactly this long after its launch.
    reclaim_first_spot_after_s: float | None = None
    # While time alone can change a decision (a hard-budget team's headroom shrinks or
    # grows with the hours left, work is held, a launch failed and a backoff or block
    # will expire), a cycle runs at least this often even when no event arrives.
    # Otherwise the next time-driven cycle is the earliest of: a team's actual spend
    # crossing its next budget threshold at the current burn, and the month turn.
    tick_s: float = 3600.0
    max_attempts: int = 3
    # What a stopped attempt keeps (see `kept_s`): None, nothing (it restarts from zero);
    # 0, everything when the task is told to stop (SIGTERM at a spot notice or a drain
    # deadline), nothing when its machine just vanishes; N > 0, also a checkpoint every
    # N seconds of run time.
    checkpoint_every_s: float | None = None
    # What-ifs (`autoscaler.sim.whatif`): a seeded share of tasks checkpoints on the
    # notice (and says so at enqueue, `checkpoints: on-signal`); every task declares its
    # true run time (`expected_runtime_s`) instead of leaving it to the estimator.
    checkpoints_share: float = 0.0
    expected_runtime_known: bool = False
    # Stop this long after the last arrival even if work is still held (counted unfinished).
    horizon_after_last_arrival_s: float = 60 * 86400.0
    start: datetime = SIM_START


class RecordingPolicy:
    """The real engine, plus a note of each decision (alerts, freezes) for the report."""

    def __init__(self, inner: PolicyEngine) -> None:
        self.inner = inner
        self.last: EvaluationResult | None = None
        self.last_input: PolicyInput | None = None

    @property
    def revision(self) -> str:
        return self.inner.revision

    def evaluate(self, policy_input: PolicyInput) -> EvaluationResult:
        self.last_input = policy_input
        self.last = self.inner.evaluate(policy_input)
        return self.last

    def close(self) -> None:
        self.inner.close()


@dataclass
class TaskTrack:
    trace: TraceTask
    queued_since: float
    wait_s: float = 0.0
    started_s: float | None = None
    finished_s: float | None = None
    state: str = "queued"
    attempts: int = 0
    lost_usd: float = 0.0
    lost_gpu_s: float = 0.0
    ran_gpu_s: float = 0.0
    kept_s: float = 0.0  # run time saved in checkpoints: the next attempt resumes from it
    last_kept_s: float = 0.0  # what the last stopped attempt kept (a gang's other ranks kept it too)


@dataclass
class InstanceTrack:
    id: str
    pool: str
    team: str | None
    gpus: int
    capacity_type: str
    zone: str | None
    price: float
    launched_s: float
    ready_s: float | None = None
    preempted: bool = False
    notice_s: float | None = None  # when the cloud shows its spot notice (virtual seconds)


@dataclass
class Sample:
    t_s: float
    instances: int
    gpus: int
    queued: int
    running: int


@dataclass
class CycleNote:
    t_s: float
    frozen: tuple[str, ...]
    drained: tuple[str, ...]
    alerts: tuple[tuple[str, str, float, str], ...]  # team, level, threshold, basis
    weights: Mapping[str, float]
    launches: int
    launch_errors: int
    held: int


@dataclass
class SimOutcome:
    workload: Workload
    config: AutoscalerConfig
    settings: SimSettings
    end_s: float
    tasks: dict[str, TaskTrack]
    instances: dict[str, InstanceTrack]
    samples: list[Sample]
    cycles: list[CycleNote]
    team_gpu_s: dict[str, float]
    preemptions: int
    sessions: sessionmaker[Session]
    wall_s: float = 0.0
    keepalive: Any = None  # the database and its tmp dir, alive as long as the outcome
    # Wall seconds per phase of the real cycle (its own timings, plus `record`: the
    # admission write and the decision record after `act`), and `cycles`, whole cycles;
    # for the bench's speed figures, never part of the report (which must not depend
    # on the machine).
    phases_s: dict[str, float] = field(default_factory=dict)


Progress = Callable[[float, float], None]  # (virtual seconds done, virtual seconds expected)


class Simulation:
    def __init__(
        self,
        workload: Workload,
        config: AutoscalerConfig,
        policy: PolicyEngine,
        sessions: sessionmaker[Session],
        settings: SimSettings | None = None,
        *,
        progress: Progress | None = None,
    ) -> None:
        self.workload = workload
        self.config = config
        self.settings = settings or SimSettings()
        self.sessions = sessions
        self.progress = progress
        self.rng = random.Random(self.settings.seed)
        self.checkpointing = checkpointing_keys(workload, self.settings.checkpoints_share, self.settings.seed)
        self.clock = ManualClock(self.settings.start)
        self.policy = RecordingPolicy(policy)
        self.fakes: dict[str, FakeProvider] = {
            p.name: FakeProvider(
                catalog_offerings(p),
                name=f"sim:{p.name}",
                clock=self.clock.now,
                record_calls=False,
                id_prefix=f"{p.name}-",
            )
            for p in config.pools
        }
        providers: dict[str, Provider] = dict(self.fakes)
        # No history points (nobody charts a simulation from them) and lean decision
        # rows: neither changes a decision, both cost time on every cycle.
        self.reconciler = Reconciler(
            sessions, config, self.clock, providers, self.policy, history_interval_s=math.inf, record_detail=False
        )
        # Read only to know WHEN a decision could change; None (an engine without a
        # directory, or no readable budgets.yaml) falls back to an hourly look.
        directory = getattr(policy, "directory", None)
        self.budgets = read_budgets(Path(directory)) if directory is not None else None
        self.ops = AgentOps(sessions)
        self.interval = config.reconcile.interval_s
        self.now_s = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self.agents: dict[str, SimAgent] = {}
        self._live: dict[str, None] = {}  # agents not known to be gone, in registration order
        self.agent_by_instance: dict[str, str] = {}
        self.tasks: dict[str, TaskTrack] = {}
        self.instances: dict[str, InstanceTrack] = {}
        self.live_instances: set[str] = set()
        self.samples: list[Sample] = []
        self.cycles: list[CycleNote] = []
        self.team_gpu_s: dict[str, float] = {}
        self.preemptions = 0
        # Queued tasks by GPUs asked: an agent with fewer free GPUs than the smallest
        # would get nothing from a lease (the server filters by free GPUs), so it is not
        # asked; that skips a full lease transaction per agent per poll.
        self._queued_gpus: Counter[int] = Counter()
        self._queued_gangs = 0
        # Gangs reserving now (sim-side mirror of the reserved ranks): task -> workers.
        self._reserving: dict[str, set[str]] = {}
        # Running gangs: task -> the workers of its ranks.
        self._ranks: dict[str, list[str]] = {}
        self._running = 0
        self._tick_at: float | None = None
        self._prev_cycle_s = -math.inf
        self._forced_done = False
        self.phases_s: dict[str, float] = {}

    # ------------------------------------------------------------------ the loop

    def run(self) -> SimOutcome:
        # Row ids and launch request ids break ties (lease order, unordered listings):
        # drawn from the seed, a run gives the same report in every process.
        with seeded_ids(self.settings.seed):
            return self._run()

    def _run(self) -> SimOutcome:
        with transaction(self.sessions) as s:
            sync_from_config(s, self.config, now=self.clock.now())
        by_time: dict[float, list[TraceTask]] = {}
        for t in self.workload.tasks:
            by_time.setdefault(t.arrival_s, []).append(t)
        for at, batch in by_time.items():
            self._push(at, Ev.ARRIVE, batch)
        last_arrival = max(by_time, default=0.0)
        expected = last_arrival + max((t.duration_s for t in self.workload.tasks), default=0.0)
        stop_at = last_arrival + self.settings.horizon_after_last_arrival_s
        last_cycle = -math.inf
        dirty = False  # nothing to look at before the first arrival
        while True:
            next_ev = self._heap[0][0] if self._heap else math.inf
            if dirty:
                t_cycle = max(last_cycle + self.interval, self.now_s)
                if t_cycle <= next_ev:
                    if t_cycle > stop_at:
                        break
                    self._set(t_cycle)
                    result = self._cycle()
                    self._prev_cycle_s, last_cycle = last_cycle, t_cycle
                    dirty = False
                    self._after_cycle_tick(result)
                    if self.progress:
                        self.progress(self.now_s, expected)
                    continue
            if next_ev == math.inf or next_ev > stop_at:
                break
            self._set(next_ev)
            while self._heap and self._heap[0][0] <= next_ev:
                _, kind, _, data = heapq.heappop(self._heap)
                dirty |= self._handle(Ev(kind), data)
        self._settle_running()
        return SimOutcome(
            self.workload,
            self.config,
            self.settings,
            self.now_s,
            self.tasks,
            self.instances,
            self.samples,
            self.cycles,
            self.team_gpu_s,
            self.preemptions,
            self.sessions,
            phases_s=dict(self.phases_s),
        )

    def _settle_running(self) -> None:
        """Work still running when the run stops used its GPUs until then (it is billed,
        and it is not idle capacity); the task stays unfinished."""
        for agent in self.agents.values():
            if agent.gone:
                continue
            for run in agent.running.values():
                gpu_s = run.gpus * (self.now_s - run.started_s)
                track = self.tasks[run.task_id]
                track.ran_gpu_s += gpu_s
                self.team_gpu_s[track.trace.team] = self.team_gpu_s.get(track.trace.team, 0.0) + gpu_s

    def _push(self, at: float, kind: Ev, data: Any) -> None:
        heapq.heappush(self._heap, (at, int(kind), next(self._seq), data))

    def _set(self, t: float) -> None:
        self.now_s = t
        self.clock.set(self.settings.start + timedelta(seconds=t))

    def _after_cycle_tick(self, result: CycleResult) -> None:
        busy = self._queued or self._running or self.live_instances
        if not busy:
            return
        at = self._next_time_driven_change(result)
        if self._tick_at is None or self._tick_at <= self.now_s or at < self._tick_at:
            self._tick_at = at
            self._push(at, Ev.WAKE, "tick")

    def _next_time_driven_change(self, result: CycleResult) -> float:
        """The earliest virtual time at which the passage of time alone could make the
        reconciler act differently; events (arrivals, boots, finishes, notices, idle
        timeouts, drain deadlines) get their own cycles."""
        tick = self.now_s + self.settings.tick_s
        ev, pin = self.policy.last, self.policy.last_input
        if ev is None or pin is None or self.budgets is None or result.plan.holds or result.launch_errors:
            return tick  # held work, a backoff, or budgets we cannot read: look hourly
        d = ev.decision
        if any(td.spend_headroom_per_hour is not None or td.drain or not td.may_scale_up for td in d.teams.values()):
            return tick  # a hard budget binds: its headroom moves with the hours left
        budgeted = any(self.budgets.of(t.name).monthly_usd for t in pin.teams)
        if budgeted and (result.launched or result.terminated or result.preempted):
            # The burn this cycle's input showed is stale: time the next look on the new one.
            # Without any budget no threshold can be crossed, so the burn times nothing.
            return self.now_s + self.interval
        at = _month_turn_s(self.settings.start, self.now_s)
        # The input's month-to-date is the ledger as of the previous cycle (each cycle
        # accrues at its end), so a crossing is timed from there; once it is past, one
        # more cycle (after the interval) is what shows it to the policy.
        since = self._prev_cycle_s if self._prev_cycle_s > -math.inf else self.now_s
        for t in pin.teams:
            budget = self.budgets.of(t.name).monthly_usd
            if not budget or t.burn_rate_usd_per_hour <= 0:
                continue
            # Actual spend grows at the burn rate; the forecast (spend + burn x hours
            # left) stays put at a constant burn, so only actual-spend crossings are timed.
            for th in self.budgets.thresholds_pct:
                target = budget * th / 100.0
                if target > t.month_to_date_usd:
                    crossing = since + (target - t.month_to_date_usd) / t.burn_rate_usd_per_hour * 3600.0
                    at = min(at, crossing + 1.0 if crossing > self.now_s else self.now_s + self.interval)
                    break
        return max(at, self.now_s + 1.0)

    # ------------------------------------------------------------------ events

    def _handle(self, kind: Ev, data: Any) -> bool:
        """Apply one event; True when the reconciler should look again."""
        # Only what the reconciler must answer marks the world dirty: work left queued,
        # a machine to terminate, an idle timeout. A finish whose worker leased again,
        # or a boot that found work, changes nothing it would act on.
        if kind == Ev.ARRIVE:
            self._arrive(data)
            return self._queued > 0
        if kind == Ev.REGISTER:
            self._register(data)
            return False
        if kind == Ev.FINISH:
            worker_id, task_id, attempt = data
            agent = self.agents.get(worker_id)
            run = agent.running.get(task_id) if agent else None
            if agent is None or run is None or run.attempt != attempt or agent.gone:
                return False
            self._end(agent, task_id, "")
            self._after_free(agent)
            return agent.gone
        if kind == Ev.DEADLINE:
            agent = self.agents.get(data)
            if agent is None or agent.gone:
                return False
            for task_id in list(agent.running):
                self._end(agent, task_id, "drain")
            self._leave(agent, "drained")
            self._poll_agents()
            return True
        if kind == Ev.PREEMPT:
            # Normally the agent stopped at the notice; one that registered during the
            # notice, or a notice of zero seconds, still runs: the machine is gone anyway.
            return self._reclaim(data)
        # WAKE: a timer (idle timeout, spot notice, tick).
        if isinstance(data, tuple) and data[0] == "idle":
            # Only a worker still idle since the timer was set can be drained for idleness:
            # one that leased again (or left) gives the reconciler nothing to act on.
            _, worker_id, idle_since = data
            agent = self.agents.get(worker_id)
            return agent is not None and not agent.gone and not agent.busy and agent.idle_since == idle_since
        if isinstance(data, tuple) and data[0] == "notice":
            return self._reclaim(data[1])
        if isinstance(data, tuple) and data[0] == "gang":
            return self._reservation_timer(data[1], data[2])
        return True

    def _reclaim(self, inst_id: str) -> bool:
        """A spot notice or the reclaim itself reaches a machine; False when it was
        terminated before. A reclaim is counted once, at its notice: the reconciler
        usually terminates the machine before the cloud takes it."""
        track = self.instances.get(inst_id)
        if track is None or inst_id not in self.live_instances:
            return False
        if not track.preempted:
            track.preempted = True
            self.preemptions += 1
        self._spot_stop(inst_id)
        return True

    def _spot_stop(self, inst_id: str) -> None:
        """What the real agent does when its metadata service shows the notice: stop every
        task (SIGTERM to checkpoint; reported `interrupted:spot`, requeued), tell the
        server it is preempted, deregister. What was not checkpointed is lost; the
        reconciler sees the requeued tasks and the notice on its next look."""
        wid = self.agent_by_instance.get(inst_id)
        agent = self.agents.get(wid) if wid else None
        if agent is None or agent.gone:
            return
        agent.draining = True
        for task_id in list(agent.running):
            self._end(agent, task_id, "spot")
        self.ops.preempted(agent, now=self.clock.now())
        self._leave(agent, "preempted")
        self._poll_agents()

    def _poll_agents(self) -> None:
        """Requeued work is leased by whichever live agent polls first and has room (the
        real agents poll every few seconds)."""
        if not self._queued:
            return
        for wid in list(self._live):
            agent = self.agents[wid]
            if agent.gone:
                self._live.pop(wid, None)
            elif not agent.draining and agent.free >= self._smallest_queued():
                self._fill(agent)

    @property
    def _queued(self) -> int:
        return self._queued_gpus.total()

    def _smallest_queued(self) -> int:
        return min(self._queued_gpus, default=0)

    def _arrive(self, batch: list[TraceTask]) -> None:
        now = self.clock.now()
        with transaction(self.sessions) as s:
            for t in batch:
                spec = task_ops.TaskSpec(
                    queue=t.queue,
                    command=["sim", t.key],
                    gpus=t.gpus,
                    nodes=t.nodes,
                    max_attempts=self.settings.max_attempts,
                    checkpoints="on-signal" if t.key in self.checkpointing else None,
                    expected_runtime_s=t.duration_s if self.settings.expected_runtime_known else None,
                )
                row = task_ops.enqueue(s, spec, team=t.team, now=now)
                self.tasks[row.id] = TaskTrack(t, self.now_s)
        self._queued_gpus.update(t.gpus for t in batch)
        self._queued_gangs += sum(1 for t in batch if t.nodes > 1)
        self._poll_agents()

    def _register(self, inst_id: str) -> bool:
        track = self.instances.get(inst_id)
        if track is None or inst_id not in self.live_instances:
            return False
        with self.sessions() as s:
            inst = s.get(Instance, inst_id)
            if inst is None or inst.state != "booting" or inst.provider_instance_id is None:
                return False
            pid, gpu_type, provider = inst.provider_instance_id, inst.gpu_type, inst.provider
        agent = self.ops.register(
            now=self.clock.now(),
            instance_id=inst_id,
            provider_instance_id=pid,
            pool=track.pool,
            provider=provider,
            gpus=track.gpus,
            gpu_type=gpu_type,
            price_per_gpu_h=track.price / max(track.gpus, 1),
            tenancy=_pool_setting(self.config.pool(track.pool), "tenancy", "team"),
            unused_cost=_pool_setting(self.config.pool(track.pool), "unused_cost", "launcher"),
        )
        track.ready_s = self.now_s
        self.agents[agent.worker_id] = agent
        self._live[agent.worker_id] = None
        self.agent_by_instance[inst_id] = agent.worker_id
        self._fill(agent)
        self._after_free(agent)
        return True

    def _fill(self, agent: SimAgent) -> None:
        """Lease until the worker's GPUs are full or nothing fits (the agent's poll)."""
        now = self.clock.now()
        while not agent.draining and not agent.gone and self._queued and agent.free >= self._smallest_queued():
            got = self.ops.lease_and_start(agent, now=now, gangs_queued=self._queued_gangs > 0)
            if got is None:
                return
            if isinstance(got, Reserved):
                self._reserved(agent, got)
                continue  # its other GPUs may still take a task that fits them
            self._began(agent, got)

    def _reserved(self, agent: SimAgent, got: Reserved) -> None:
        agent.reserved[got.task_id] = (got.rank_id, got.gpus)
        agent.idle_since = None
        holders = self._reserving.setdefault(got.task_id, set())
        if not holders:
            # The gang's first rank: past the timeout, its agents' next lease releases it.
            self._gang_timer(got.task_id, self.now_s)
        holders.add(agent.worker_id)

    def _gang_timer(self, task_id: str, since_s: float) -> None:
        at = since_s + gangs.GangSettings().reservation_timeout_s + GANG_POLL_S
        self._push(max(at, self.now_s + GANG_POLL_S), Ev.WAKE, ("gang", task_id, since_s))

    def _began(self, agent: SimAgent, got: Leased, *, first: bool = True) -> None:
        """A task, or one rank of a gang, started on this agent; a gang's other ranks
        start now too (their agents' next lease hands them the start)."""
        track = self.tasks[got.task_id]
        if track.state != "running":  # the task's (or the gang's) attempt begins
            track.wait_s += self.now_s - track.queued_since
            track.attempts = got.attempt
            track.state = "running"
            if track.started_s is None:
                track.started_s = self.now_s
            self._queued_gpus[got.gpus] -= 1
            if not self._queued_gpus[got.gpus]:
                del self._queued_gpus[got.gpus]
            if got.nodes > 1:
                self._queued_gangs -= 1
                self._reserving.pop(got.task_id, None)
                self._ranks[got.task_id] = []
            self._running += 1
        agent.reserved.pop(got.task_id, None)
        agent.running[got.task_id] = RunningTask(got.task_id, got.gpus, self.now_s, got.attempt)
        agent.idle_since = None
        if got.nodes > 1:
            self._ranks[got.task_id].append(agent.worker_id)
        remaining = max(track.trace.duration_s - track.kept_s, 0.0)
        self._push(self.now_s + remaining, Ev.FINISH, (agent.worker_id, got.task_id, got.attempt))
        for wid in got.starting if first else ():
            other = self.agents[wid]
            start = self.ops.lease_and_start(other, now=self.clock.now())
            if not isinstance(start, Leased) or start.task_id != got.task_id:
                raise RuntimeError(f"gang {got.task_id}: worker {wid} was not handed its rank's start")
            self._began(other, start, first=False)

    def _reservation_timer(self, task_id: str, since_s: float) -> bool:
        """The gang's reservation may be past its timeout: one of its agents asks again
        (that lease releases a stale reservation, and may reserve anew), then the
        simulator mirrors the reserved ranks the database holds."""
        holders = self._reserving.get(task_id)
        if not holders:
            return False  # it started, or every rank was given up
        agent = self.agents[min(holders)]
        if not agent.gone:
            # It asks although its GPUs are held: that is what a reserving agent does.
            got = self.ops.lease_and_start(agent, now=self.clock.now(), gangs_queued=True)
            if isinstance(got, Reserved):
                self._reserved(agent, got)
            elif got is not None:
                self._began(agent, got)
        return self._sync_reservation(task_id)

    def _sync_reservation(self, task_id: str) -> bool:
        """Make the agents' reserved ranks of this gang the database's: agents whose rank
        was released look for other work (or go idle); a gang reserving anew gets its
        timer. True when any rank was released."""
        held = self.ops.reserved_on(task_id) if self.tasks[task_id].state == "queued" else {}
        before = self._reserving.pop(task_id, set())
        released = []
        for wid in sorted(before | set(held)):
            agent = self.agents[wid]
            if wid in held:
                rank_id, gpus, _at = held[wid]
                agent.reserved[task_id] = (rank_id, gpus)
            elif agent.reserved.pop(task_id, None) is not None:
                released.append(agent)
        if held:
            self._reserving[task_id] = set(held)
            oldest = min(at for _, _, at in held.values())
            since = (oldest.replace(tzinfo=UTC) if oldest.tzinfo is None else oldest) - self.settings.start
            self._gang_timer(task_id, since.total_seconds())
        for agent in released:
            self._after_free(agent)
        if released and task_id not in self._reserving:
            self._poll_agents()  # it forms again when agents poll (behind the work waiting)
        return bool(released)

    def _end(self, agent: SimAgent, task_id: str, interrupted: str, *, canceled: bool = False) -> None:
        track = self.tasks[task_id]
        was_running = track.state == "running"
        ended = self.ops.finish(
            agent, task_id, now=self.clock.now(), now_s=self.now_s, interrupted=interrupted, canceled=canceled
        )
        gpu_s = ended.gpus * ended.ran_s
        track.ran_gpu_s += gpu_s
        team = track.trace.team
        self.team_gpu_s[team] = self.team_gpu_s.get(team, 0.0) + gpu_s
        track.state = ended.state
        if interrupted or canceled:
            # A gang's ranks resume from one checkpoint: what the first rank's end kept
            # (SIGTERM on a notice) is what every rank kept; the others were told to stop.
            every = checkpoint_every_s(track.trace.key, self.settings.checkpoint_every_s, self.checkpointing)
            if was_running:
                kept = kept_s(ended.ran_s, every, told_to_stop=interrupted in ("spot", "drain"))
                track.kept_s += kept
                track.last_kept_s = kept
            else:
                kept = track.last_kept_s
            lost_gpu_s = ended.gpus * max(ended.ran_s - kept, 0.0)
            track.lost_gpu_s += lost_gpu_s
            track.lost_usd += lost_gpu_s / 3600.0 * agent.price_per_gpu_h
        if not was_running or ended.state == "running":
            return  # a gang's rank: the gang's attempt ended before, or goes on
        self._running -= 1
        if ended.state == "queued":
            track.queued_since = self.now_s
            self._queued_gpus[track.trace.gpus] += 1
            self._queued_gangs += int(track.trace.nodes > 1)
        elif ended.state in TASK_FINAL:
            track.finished_s = self.now_s
        ranks = self._ranks.pop(task_id, [])
        for wid in ranks:
            # Told to stop on their next heartbeat: SIGTERM, the grace, the report.
            other = self.agents[wid]
            if other is not agent and task_id in other.running:
                self._end(other, task_id, "", canceled=True)
                self._after_free(other)

    def _after_free(self, agent: SimAgent) -> None:
        if agent.gone:
            return
        if agent.draining:
            if not agent.busy:
                self._leave(agent, "drained")
            return
        self._fill(agent)
        if not agent.busy and agent.idle_since is None:
            # It just became idle: a timer for its idle timeout (a lease clears it) and,
            # in an adaptive pool, one for the warm floor, when the planner may first
            # drain it (planner.warm_pool).
            agent.idle_since = self.now_s
            pool = self.config.pool(agent.pool)
            timeout = pool.idle_timeout_s if pool else 300.0
            if pool is not None and pool.warm_pool == "adaptive" and timeout > WARM_FLOOR_S:
                self._push(self.now_s + WARM_FLOOR_S + 1.0, Ev.WAKE, ("idle", agent.worker_id, agent.idle_since))
            self._push(self.now_s + timeout + 1.0, Ev.WAKE, ("idle", agent.worker_id, agent.idle_since))

    def _leave(self, agent: SimAgent, reason: str) -> None:
        if not agent.gone:
            self.ops.leave(agent, now=self.clock.now(), reason=reason)
        self._forget_reservations(agent)

    def _forget_reservations(self, agent: SimAgent) -> None:
        """A worker that left gave up its reserved ranks (the server released them)."""
        for task_id in list(agent.reserved):
            agent.reserved.pop(task_id)
            holders = self._reserving.get(task_id)
            if holders is not None:
                holders.discard(agent.worker_id)
                if not holders:
                    self._reserving.pop(task_id)

    # ------------------------------------------------------------------ the real cycle

    def _cycle(self) -> CycleResult:
        now = self.clock.now()
        self.ops.heartbeat_all(now=now)
        t0 = time.perf_counter()
        result = self.reconciler.run_cycle()
        self._time_phases(result, time.perf_counter() - t0)
        self._note(result)
        self._launched(result)
        self._terminated(result)
        self._drains(result)
        self.samples.append(
            Sample(
                self.now_s,
                len(self.live_instances),
                sum(self.instances[i].gpus for i in self.live_instances),
                self._queued,
                self._running,
            )
        )
        return result

    def _time_phases(self, result: CycleResult, wall_s: float) -> None:
        phases = self.phases_s
        for name, ms in result.timings_ms.items():
            if name != "total":
                phases[name] = phases.get(name, 0.0) + ms / 1000.0
        # What run_cycle times itself ends at `act`; the rest is the admission write and
        # the decision record (with the ledger's accrual).
        record = wall_s - result.timings_ms.get("total", 0.0) / 1000.0
        phases["record"] = phases.get("record", 0.0) + record
        phases["cycles"] = phases.get("cycles", 0.0) + wall_s

    def _note(self, result: CycleResult) -> None:
        ev = self.policy.last
        if ev is None:
            return
        d = ev.decision
        self.cycles.append(
            CycleNote(
                self.now_s,
                tuple(sorted(t for t, td in d.teams.items() if not td.may_scale_up)),
                tuple(sorted(t for t, td in d.teams.items() if td.drain)),
                tuple((a.team or "", a.level, a.threshold_pct, a.basis) for a in d.alerts),
                {t: td.priority_weight for t, td in d.teams.items()},
                len(result.launched),
                len(result.launch_errors),
                sum(h.tasks for h in result.plan.holds),
            )
        )

    def _launched(self, result: CycleResult) -> None:
        if not result.launched:
            return
        with self.sessions() as s:
            rows = list(s.scalars(select(Instance).where(Instance.id.in_(result.launched))))
        lo, hi = self.settings.boot_delay_s
        for inst in rows:
            if inst.provider_instance_id is None:
                continue
            track = InstanceTrack(
                inst.id, inst.pool, inst.team, inst.gpus, inst.capacity_type, inst.zone, inst.hourly_price, self.now_s
            )
            self.instances[inst.id] = track
            self.live_instances.add(inst.id)
            self._push(self.now_s + self.rng.uniform(lo, hi), Ev.REGISTER, inst.id)
            if inst.capacity_type == "spot":
                self._schedule_reclaim(inst, track)

    def _schedule_reclaim(self, inst: Instance, track: InstanceTrack) -> None:
        rate = self.settings.preemption_by_zone.get(inst.zone or "", self.settings.preemption_per_hour)
        forced = self.settings.reclaim_first_spot_after_s
        if forced is not None and not self._forced_done:
            self._forced_done = True
            at = self.now_s + forced
        elif rate <= 0:
            return
        else:
            at = self.now_s + self.rng.expovariate(rate) * 3600.0
        pool = self.config.pool(inst.pool)
        notice = self.settings.notice_s
        if notice is None:
            notice = NOTICE_S.get(pool.provider if pool else "", 120.0)
        assert inst.provider_instance_id is not None
        self.fakes[inst.pool].schedule_preemption(
            inst.provider_instance_id, self.settings.start + timedelta(seconds=at), notice_s=notice
        )
        track.notice_s = max(at - notice, self.now_s)
        self._push(track.notice_s, Ev.WAKE, ("notice", inst.id))
        self._push(at, Ev.PREEMPT, inst.id)

    def _terminated(self, result: CycleResult) -> None:
        for inst_id in result.terminated:
            self.live_instances.discard(inst_id)
            wid = self.agent_by_instance.get(inst_id)
            agent = self.agents.get(wid) if wid else None
            if agent is not None and not agent.gone:
                # The machine was terminated under a live agent: its work is interrupted.
                for task_id in list(agent.running):
                    self._end(agent, task_id, "terminated")
                agent.gone = True
                self._forget_reservations(agent)
        self._poll_agents()

    def _drains(self, result: CycleResult) -> None:
        """Agents learn of a drain (idle timeout, budget, spot notice) as on a heartbeat."""
        if not result.drained and not self._unaware_of_notice():
            # Nothing to learn, so no query (most cycles drain nothing): the plan's
            # drains are in `result.drained`, and a spot notice's drain (the sync's)
            # can reach only an agent that has not stopped for the notice itself yet (it
            # registered after the notice, or the notice shows at this very instant,
            # before its event is handled); an agent's own drain the simulator knows.
            return
        with self.sessions() as s:
            rows = list(s.execute(select(Worker.id, Worker.drain_deadline).where(Worker.state == "draining")))
        for wid, deadline in rows:
            agent = self.agents.get(wid)
            if agent is None or agent.gone or agent.draining:
                continue
            agent.draining = True
            if not agent.running:
                self._leave(agent, "drained")
                # The reconciler terminates a drained machine on its next look.
                self._push(self.now_s, Ev.WAKE, "drained")
                continue
            at = self.now_s
            if deadline is not None:
                dl = deadline if deadline.tzinfo else deadline.replace(tzinfo=UTC)
                at = max((dl - self.settings.start).total_seconds(), self.now_s)
            self._push(at, Ev.DEADLINE, wid)

    def _unaware_of_notice(self) -> bool:
        """A live agent not draining on a machine whose spot notice is shown by now."""
        for wid in self._live:
            agent = self.agents[wid]
            if agent.gone or agent.draining:
                continue
            notice = self.instances[agent.instance_id].notice_s
            if notice is not None and notice <= self.now_s:
                return True
        return False


def kept_s(ran_s: float, every_s: float | None, *, told_to_stop: bool) -> float:
    """Run time a stopped attempt saved (`SimSettings.checkpoint_every_s`)."""
    if every_s is None:
        return 0.0
    if told_to_stop:
        return ran_s  # SIGTERM, then the grace to write a checkpoint
    return math.floor(ran_s / every_s) * every_s if every_s > 0 else 0.0


def _month_turn_s(start: datetime, now_s: float) -> float:
    """Virtual seconds at the first instant of the next calendar month (UTC)."""
    _, nxt = month_bounds(start + timedelta(seconds=now_s))
    return (nxt - start).total_seconds()


def _pool_setting(pool: PoolConfig | None, key: str, default: str) -> str:
    """A pool's tenancy or unused_cost as its agents register it (the real API's rule)."""
    return str(getattr(pool, key)) if pool is not None else default
