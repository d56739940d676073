"""One reconcile cycle: observe -> evaluate the policy -> plan -> act -> record.

`Reconciler.run_cycle()` is the whole loop body; the server calls it from APScheduler
and the simulator calls it in a loop with a virtual clock. It reads time only from the
injected clock, never sleeps, and talks to clouds only through `providers` (the
actions through its executor).

Safety rules carried out here (the planner decides *what*, this module *how*):

- **Launch intent first.** An `Instance` row with a fresh request id is committed
  before the provider is called, and the id is the provider's idempotency key. After a
  crash, an intent whose request id shows up in the provider's listing is adopted; one
  that does not is launched again with the *same* id, which the provider answers with
  the instance of the first call if there was one. So a launch is never doubled.
- **Observe, then decide, then act.** Every provider read (listings, interruption
  notices) is made with no transaction open; the passive sync (`sync.passive_sync`,
  pure) turns rows + observation into transitions (adopt, confirm termination,
  preemption, loss, orphans: our owner tag, no record, launched and first seen longer
  than the grace period ago), applied in one short transaction before the plan is
  made; notices are acknowledged to the provider only after it committed.
- **Actions report back.** Launch and terminate calls go to an executor
  (`executor.py`): threads under `autoscaler up`, so the cycle never waits on a cloud
  operation; outcomes are applied by the next cycle (sync mode: at once).
- **Static (on-prem) pools are capacity, never inventory.** Their workers (agents
  started on machines someone else owns, with the pool's join token) are planned on
  like any worker, but their listings never adopt, lose or orphan anything: the
  reconciler never launches or terminates a static machine, it only drains (and the
  planner does not drain static workers for idleness: they cost nothing to keep).
- **Errors steer the next plan.** Capacity and quota errors block the offering (or zone,
  region, provider) for a TTL and back the pool off exponentially; transient errors
  leave the intent to be retried with the same id.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Protocol, cast

from sqlalchemy import null, select, update
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.admission import right_size
from autoscaler.admission import store as admission_store
from autoscaler.admission.model import admissions
from autoscaler.clock import Clock
from autoscaler.config import AutoscalerConfig, PoolConfig
from autoscaler.errors import Conflict
from autoscaler.ledger.reclaims import ReclaimEvidence, reclaim_prior
from autoscaler.ledger.spend import shared_pools
from autoscaler.lifecycle import INSTANCE_FINAL, WORKER_LEASABLE, WORKER_LIVE
from autoscaler.planner import Plan, plan
from autoscaler.planner.model import Launch, OfferingView
from autoscaler.planner.reclaim_rate import ReclaimEstimate
from autoscaler.policy.schema import Decision, EvaluationResult, PolicyEngine, PolicyInput
from autoscaler.queueing.capacity_view import capacity_model, standby_on
from autoscaler.queueing.workers import drain as drain_worker
from autoscaler.queueing.workers import expel_impostors, expire_silent_workers, interruption_notice
from autoscaler.reconciler import sync
from autoscaler.reconciler.crashpoints import crash_point
from autoscaler.reconciler.errors import backoff_delay, block_for
from autoscaler.reconciler.executor import Executor, LaunchDone, Outcome, SyncExecutor, TerminateDone
from autoscaler.reconciler.record import record_cycle
from autoscaler.reconciler.snapshot import PoolState, Snapshot, observe, policy_input, standby_exposure
from autoscaler.reconciler.states import InstanceState, transition
from autoscaler.state.db import transaction
from autoscaler.state.launches import gang_rows
from autoscaler.state.lifecycle_log import note
from autoscaler.state.models import Instance, InstanceEvent, OfferingBlock, Worker, new_id
from providers.base import (
    TAG_POOL,
    TAG_TEAM,
    AcknowledgedInterruptions,
    CapacityType,
    InterruptionEvent,
    InterruptionSource,
    LaunchRequest,
    Offering,
    Provider,
    ProviderError,
    ProviderInstance,
    RateLimited,
)

log = logging.getLogger(__name__)
# How often the reclaim evidence (ledger.reclaims) is re-read, in clock seconds.
RECLAIM_REFRESH_S = 300.0
S = InstanceState
OFFERINGS_TTL_S = 600.0


class UserData(Protocol):
    """Renders the user-data for one launch, creating its join token in `session`: one
    registration, or `nodes` (each a distinct machine of the launch, once) for a gang."""

    def __call__(self, session: Session, pool: PoolConfig, request_id: str, nodes: int = 1, /) -> str: ...


@dataclass
class CycleResult:
    at: datetime
    plan: Plan
    decision_id: int | None = None
    policy_revision: str = ""
    policy_error: str | None = None
    launched: list[str] = field(default_factory=list)
    launch_errors: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    drains_refused: list[str] = field(default_factory=list)
    terminated: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    # Declared on-prem machines (a static pool's `options.machines`) with no live agent:
    # not capacity until their agent registers, since nothing can be run on them.
    static_without_agent: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)


@dataclass
class _PoolRuntime:
    offerings: tuple[OfferingView, ...] = ()
    offerings_at: datetime | None = None
    failures: int = 0
    backoff_until: datetime | None = None


def _view(o: Offering) -> OfferingView:
    return OfferingView(
        o.instance_type, o.capacity_type, o.zone, o.gpus, o.gpu_type, o.hourly_price, o.cpus, o.memory_mb
    )


class Reconciler:
    """The control loop. One instance per process; only the leader calls `run_cycle`."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        config: AutoscalerConfig,
        clock: Clock,
        providers: Mapping[str, Provider],
        policy: PolicyEngine,
        *,
        user_data: UserData | None = None,
        perf: Callable[[], float] = time.perf_counter,
        history_interval_s: float = 60.0,
        drain_deadline_s: float = 300.0,
        record_detail: bool = True,
        executor: Executor | None = None,
    ) -> None:
        self.sessions = sessions
        self.config = config
        self.clock = clock
        self.providers = dict(providers)
        self.policy = policy
        self.user_data = user_data
        self.perf = perf
        self.history_interval_s = history_interval_s
        self.drain_deadline_s = drain_deadline_s
        # False only in the simulator: lean decision rows (see `record_cycle`).
        self.record_detail = record_detail
        self.pools = {p.name: p for p in config.pools}
        self._state: dict[str, _PoolRuntime] = {p.name: _PoolRuntime() for p in config.pools}
        # When a recorded instance first went missing from its listing (a grace period
        # absorbs eventual consistency), and when an unknown tagged instance was first seen.
        self._missing_since: dict[str, datetime] = {}
        self._orphan_seen: dict[str, datetime] = {}
        # Declared static machines last reported without an agent (logged on change only).
        self._static_silent: dict[str, frozenset[str]] = {}
        self._last_history: datetime | None = None
        self._last_accrual: datetime | None = None
        self._reclaim: dict[str, ReclaimEstimate] = {}
        self._reclaim_at: datetime | None = None
        self._evidence: ReclaimEvidence | None = None
        # Where provider calls run: at once in this thread (the default: the simulator and
        # most tests), or on bounded thread pools reporting back (`autoscaler up`).
        self.executor: Executor = executor or SyncExecutor()
        # Rows whose launch failed as this cycle learned (steers the rest of its launches).
        self._failed_now: set[str] = set()

    # ------------------------------------------------------------------ the cycle

    def run_cycle(self) -> CycleResult:
        t0 = self.perf()
        now = self.clock.now()
        timings: dict[str, float] = {}
        result = CycleResult(at=now, plan=Plan())
        self._failed_now.clear()
        # Outcomes of provider calls that finished since the last cycle (threaded mode).
        self._apply_outcomes(now, result)
        # Observe: every provider read, with no transaction open.
        self._refresh_offerings(now)
        observation = self._observe_providers()
        with transaction(self.sessions) as s:
            expire_silent_workers(s, now=now, timeout_s=self.config.reconcile.heartbeat_timeout_s)
        # Decide and record the passive transitions in one short transaction.
        with transaction(self.sessions) as s:
            synced = self._sync(s, observation, now, result)
        crash_point("after_sync_commit")
        # Only now that they are recorded may the provider forget the notices.
        self._acknowledge(observation)
        self._terminate_provider_ids([(t.pool, t.provider_instance_id) for t in synced.terminate], now, result)
        timings["sync"] = (self.perf() - t0) * 1000

        t1 = self.perf()
        snap = self.observe(now)
        timings["snapshot"] = (self.perf() - t1) * 1000
        t2 = self.perf()
        evaluation = self.evaluate(snap)
        timings["policy"] = (self.perf() - t2) * 1000
        t3 = self.perf()
        the_plan = plan(snap.plan_input(evaluation.decision, drain_deadline_s=self.drain_deadline_s))
        timings["plan"] = (self.perf() - t3) * 1000
        # The lease gate's copy of this decision, before anything is acted on: from
        # here on every lease answers to it (the headroom net of what this plan buys).
        spent: dict[str, float] = defaultdict(float)
        for launch in the_plan.launches:
            spent[launch.team] += launch.hourly_price
        with transaction(self.sessions) as s:
            admission_store.write(s, admissions(evaluation.decision, spent), now=now)
            if the_plan.right_size_lifted:
                s.execute(
                    update(Instance)
                    .where(Instance.id.in_(the_plan.right_size_lifted))
                    .values(smaller_machines=null())
                    .execution_options(synchronize_session=False)
                )
        result.plan = the_plan
        result.policy_revision = evaluation.revision
        result.policy_error = evaluation.error

        t4 = self.perf()
        self.act(the_plan, now, result)
        timings["act"] = (self.perf() - t4) * 1000
        timings["total"] = (self.perf() - t0) * 1000
        result.timings_ms = timings
        crash_point("before_record")
        with transaction(self.sessions) as s:
            history = (
                self._last_history is None or (now - self._last_history).total_seconds() >= self.history_interval_s
            )
            result.decision_id = record_cycle(
                s,
                now=now,
                snap=snap,
                evaluation=evaluation,
                result=result,
                history=history,
                accrue_since=self._last_accrual,
                detail=self.record_detail,
                shared=shared_pools(self.config),
                notifications=self.config.notifications,
            )
        if history:
            self._last_history = now
        self._last_accrual = now
        return result

    def observe(self, now: datetime) -> Snapshot:
        pool_state = {
            name: PoolState(st.offerings, st.backoff_until, _max_gang_nodes(self.providers.get(name)))
            for name, st in self._state.items()
        }
        with self.sessions() as s:
            snap = observe(s, self.config, now=now, pool_state=pool_state)
            cap = self.config.capacity
            if not cap.enabled:
                return snap
            # Reclaim evidence changes slowly (it decays over days): refresh it every
            # RECLAIM_REFRESH_S, not every cycle; each refresh reads the live spot fleet
            # and what ended since the last one, not history.
            if self._reclaim_at is None or (now - self._reclaim_at).total_seconds() >= RECLAIM_REFRESH_S:
                if self._evidence is None or self._evidence.prior != reclaim_prior(cap):  # new config
                    self._evidence = ReclaimEvidence(reclaim_prior(cap))
                self._reclaim = self._evidence.refresh(s, now)
                self._reclaim_at = now
            model = capacity_model(cap, self._reclaim)
            shared = cap.standby_scope == "shared"
            standby = standby_exposure(s, model, now, shared=shared) if standby_on(cap) else None
        return replace(snap, reclaim=dict(self._reclaim), capacity=model, standby=standby)

    def evaluate(self, snap: Snapshot) -> EvaluationResult:
        pin = _with_static_capacity(policy_input(snap, self.config), snap)
        try:
            return self.policy.evaluate(pin)
        except Exception as exc:  # the engine promises not to raise; fail safe if it does
            log.exception("policy engine raised")
            msg = f"{type(exc).__name__}: {exc}"
            return EvaluationResult(decision=Decision.failed(msg), revision="", input_digest="", eval_ms=0.0, error=msg)

    # ------------------------------------------------------------------ observe providers

    def _refresh_offerings(self, now: datetime) -> None:
        for name, provider in self.providers.items():
            st = self._state.setdefault(name, _PoolRuntime())
            if st.offerings_at is not None and (now - st.offerings_at).total_seconds() < OFFERINGS_TTL_S:
                continue
            try:
                st.offerings = tuple(_view(o) for o in provider.offerings())
                st.offerings_at = now
            except ProviderError as exc:
                log.warning("pool %s: cannot list offerings (%s); keeping the last known", name, exc.message)

    def _observe_providers(self) -> sync.Observation:
        """Each pool's listing (a pool whose listing fails is left out: nothing of it is
        judged lost), then every interruption notice; no transaction is open."""
        listings: dict[str, list[ProviderInstance]] = {}
        static: set[str] = set()
        for name, provider in self.providers.items():
            try:
                listed = provider.list(self.config.deployment)
            except ProviderError as exc:
                log.warning("pool %s: listing failed (%s); skipping its sync this cycle", name, exc.message)
                continue
            listings[name] = [pi for pi in listed if (pi.pool or pi.tags.get(TAG_POOL, name)) == name]
            if provider.capabilities.static:
                static.add(name)
        notices: list[tuple[str, InterruptionEvent]] = []
        for name, provider in self.providers.items():
            if not provider.capabilities.interruption_events or not isinstance(provider, InterruptionSource):
                continue
            try:
                notices.extend((name, ev) for ev in provider.interruptions())
            except ProviderError as exc:
                log.warning("pool %s: cannot read interruption notices (%s)", name, exc.message)
        return sync.Observation(listings=listings, static_pools=frozenset(static), interruptions=tuple(notices))

    def _acknowledge(self, observation: sync.Observation) -> None:
        """Tell the providers the notices are recorded (AWS deletes them from SQS); a
        notice never acknowledged (a crash, a rolled-back sync) is delivered again."""
        by_pool: dict[str, list[InterruptionEvent]] = defaultdict(list)
        for pool, ev in observation.interruptions:
            by_pool[pool].append(ev)
        for pool, events in by_pool.items():
            provider = self.providers.get(pool)
            if isinstance(provider, AcknowledgedInterruptions):
                try:
                    provider.acknowledge(events)
                except ProviderError as exc:
                    log.warning("pool %s: cannot acknowledge notices (%s); they come back", pool, exc.message)

    def _sync(self, s: Session, observation: sync.Observation, now: datetime, result: CycleResult) -> sync.SyncResult:
        """Passive transitions: read the open rows and live workers, decide
        (`sync.passive_sync`, pure), apply. Returns what to terminate (orphans, and
        instances we are still waiting to see gone)."""
        # Column rows for the decision (every open instance, every cycle); entities only
        # for the few rows a change is applied to.
        open_rows = s.execute(
            select(
                Instance.id,
                Instance.pool,
                Instance.request_id,
                Instance.state,
                Instance.provider_instance_id,
                Instance.worker_id,
                Instance.launched_at,
                Instance.created_at,
                Instance.launch_request_id,
            ).where(Instance.state.not_in(INSTANCE_FINAL))
        ).all()
        workers = {
            (str(pool), str(iid)): str(wid)
            for pool, iid, wid in s.execute(
                select(Worker.pool, Worker.instance_id, Worker.id).where(
                    Worker.state.in_(WORKER_LIVE), Worker.instance_id.is_not(None)
                )
            )
        }
        rows = [
            sync.Row(
                id=i.id,
                pool=i.pool,
                request_id=i.request_id,
                state=S(i.state),
                provider_instance_id=i.provider_instance_id,
                worker_id=i.worker_id,
                launched_at=i.launched_at,
                created_at=i.created_at,
                launch_request_id=i.launch_request_id,
            )
            for i in open_rows
        ]
        obs = replace(observation, workers=workers)
        settings = sync.Settings(orphan_grace=timedelta(seconds=self.config.reconcile.orphan_grace_s))
        out = sync.passive_sync(rows, obs, now, settings, sync.Memory(self._missing_since, self._orphan_seen))
        self._missing_since, self._orphan_seen = dict(out.memory.missing_since), dict(out.memory.orphan_seen)
        changed = sorted({c.row_id for c in out.changes})
        by_id = {
            i.id: i
            for k in range(0, len(changed), 500)
            for i in s.scalars(select(Instance).where(Instance.id.in_(changed[k : k + 500])))
        }
        for change in out.changes:
            inst = by_id[change.row_id]
            if isinstance(change, sync.Adopt):
                self._record_launched(s, inst, change.instance, now, reason=change.reason, find_worker=False)
            elif isinstance(change, sync.Move):
                transition(s, inst, change.to, reason=change.reason, now=now)
            elif isinstance(change, sync.RecordProviderId):
                inst.provider_instance_id = change.provider_instance_id
                log.warning(
                    "instance %s: terminating with no provider id, but the provider lists %s for its "
                    "request id; terminating that",
                    inst.id,
                    change.provider_instance_id,
                )
            elif isinstance(change, sync.BindWorker):
                inst.worker_id = change.worker_id
            elif isinstance(change, sync.Drain):
                # A spot notice drains with the notice's deadline; a rebalance only stops
                # new leases (queueing.workers.interruption_notice).
                interruption_notice(
                    s,
                    inst,
                    change.kind,
                    now + timedelta(seconds=change.deadline_s),
                    change.detail,
                    now=now,
                    rebalance_deadline_s=self.config.reconcile.rebalance_drain_deadline_s,
                )
        result.adopted.extend(out.adopted)
        result.preempted.extend(out.preempted)
        result.lost.extend(out.lost)
        result.orphans.extend(out.orphans)
        for pid in out.orphans:
            log.warning("terminating orphan %s (owner tag %s, no record)", pid, self.config.deployment)
        for pool_name, silent in out.static_without_agent.items():
            self._static_machines(pool_name, silent, result)
        return out

    def _static_machines(self, pool_name: str, silent: frozenset[str], result: CycleResult) -> None:
        """Declared on-prem machines are not ours to adopt, lose or orphan (no instance rows,
        so the planner can never terminate one); only say which have no agent running."""
        result.static_without_agent.extend(sorted(silent))
        if silent != self._static_silent.get(pool_name, frozenset()):
            if silent:
                log.info(
                    "pool %s: declared machine(s) %s have no agent registered; start the agent there "
                    "with a join token for this pool",
                    pool_name,
                    ", ".join(sorted(silent)),
                )
            else:
                log.info("pool %s: every declared machine has an agent", pool_name)
            self._static_silent[pool_name] = silent

    def _terminate_provider_ids(self, pairs: list[tuple[str, str]], now: datetime, result: CycleResult) -> None:
        """Re-terminations and orphans, one call per pool, through the executor (a call
        already in flight is not repeated); the listing confirms them later."""
        by_pool: dict[str, list[str]] = {}
        busy = self.executor.terminating()
        for pool_name, pid in pairs:
            if (pool_name, pid) not in busy:
                by_pool.setdefault(pool_name, []).append(pid)
        for pool_name, ids in by_pool.items():
            self.executor.submit_terminate(self.providers[pool_name], pool_name, ids)
        self._apply_outcomes(now, result)

    # ------------------------------------------------------------------ outcomes

    def _apply_outcomes(self, now: datetime, result: CycleResult) -> list[Outcome]:
        """Record what the executor's finished calls did (in sync mode: the call just made):
        the successes in one transaction, then each failure (blocks, backoff)."""
        done = self.executor.outcomes()
        if not done:
            return done
        crash_point("before_apply_outcome")
        failed = [o for o in done if isinstance(o, LaunchDone) and o.error is not None]
        ok = [o for o in done if not (isinstance(o, LaunchDone) and o.error is not None)]
        after: list[Callable[[], None]] = []
        if any(isinstance(o, LaunchDone) or o.row_ids or o.error is not None for o in ok):
            with transaction(self.sessions) as s:
                for o in ok:
                    if isinstance(o, LaunchDone):
                        self._apply_launch(s, o, now, result, after)
                    else:
                        self._apply_terminate(s, o, now, result, after)
        for fn in after:
            fn()
        for o in failed:
            assert isinstance(o, LaunchDone) and o.error is not None
            self._apply_launch_error(o, o.error, now, result)
        return done

    def _apply_terminate(
        self, s: Session, done: TerminateDone, now: datetime, result: CycleResult, after: list[Callable[[], None]]
    ) -> None:
        if done.error is not None:
            msg = done.error.message if isinstance(done.error, ProviderError) else repr(done.error)
            log.warning("pool %s: terminate %s failed (%s); will retry", done.pool, list(done.provider_ids), msg)
            return
        for row_id in done.row_ids:
            inst = s.get(Instance, row_id)
            if inst is not None and inst.state == S.TERMINATING:
                transition(s, inst, S.TERMINATED, reason="terminated", now=now)
                inst.terminated_at = now
        after.append(lambda: result.terminated.extend(done.row_ids))

    # ------------------------------------------------------------------ act

    def act(self, the_plan: Plan, now: datetime, result: CycleResult) -> None:
        """Carry out a plan: terminations, then drains, then resumed intents, then launches."""
        for t in the_plan.terminations:
            self._terminate(t.instance_id, t.reason, t.mark, now, result)
        for d in the_plan.drains:
            with transaction(self.sessions) as s:
                try:
                    drain_worker(
                        s,
                        d.worker_id,
                        now=now,
                        deadline_s=d.deadline_s,
                        reason=d.reason[:64],
                        only_if_idle=d.only_if_idle,
                    )
                except Conflict as exc:
                    result.drains_refused.append(f"{d.worker_id}: {exc.message}")
                    continue
                inst = s.get(Instance, d.instance_id) if d.instance_id else None
                if inst is not None and inst.state == S.READY:
                    transition(s, inst, S.DRAINING, reason=d.reason, now=now)
            crash_point("after_drain")
            result.drained.append(d.worker_id)
        self._resume_intents(now, result)
        if not self.executor.inline:
            self._launch_batch(list(the_plan.launches), now, result)
            return
        failed_offerings: set[tuple[str, str]] = set()
        for launch in the_plan.launches:
            st = self._state[launch.pool]
            if (launch.pool, launch.offering.key) in failed_offerings or (
                st.backoff_until is not None and st.backoff_until > now
            ):
                continue
            inst_id = self._write_intent(launch, now)
            crash_point("after_intent")
            ok = self._call_launch(inst_id, now, result)
            if not ok:
                failed_offerings.add((launch.pool, launch.offering.key))
        # Whatever already finished (threaded mode); the rest is applied by a later cycle.
        self._apply_outcomes(now, result)

    def _terminate(self, inst_id: str, reason: str, mark: str | None, now: datetime, result: CycleResult) -> None:
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            if inst is None or inst.state in INSTANCE_FINAL or inst.state == S.TERMINATING:
                return
            if mark and inst.state != mark:
                transition(s, inst, S(mark), reason=reason, now=now)
            transition(s, inst, S.TERMINATING, reason=reason, now=now)
            pid, pool = inst.provider_instance_id, inst.pool
        crash_point("after_terminate_intent")
        provider = self.providers.get(pool)
        if pid is not None and provider is not None:
            # Marked `terminated` when the outcome is applied; a failed call leaves the
            # row `terminating`, which the next sync terminates again.
            self.executor.submit_terminate(provider, pool, [pid], [inst_id])
            self._apply_outcomes(now, result)
            return
        # No instance recorded: nothing to call. A launch still in flight is terminated
        # when its outcome arrives; one a crash left behind is an orphan for the listing.
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            if inst is not None and inst.state == S.TERMINATING:
                transition(s, inst, S.TERMINATED, reason="terminated", now=now)
                inst.terminated_at = now
        result.terminated.append(inst_id)

    def _write_intent(self, launch: Launch, now: datetime) -> str:
        """Commit the launch intent; the provider is called only after this returns."""
        with transaction(self.sessions) as s:
            return self._add_intent(s, launch, now)

    def _add_intent(self, s: Session, launch: Launch, now: datetime) -> str:
        """Add the launch's rows (one per machine: a gang launch's k rows share its
        request id, the first row's own, as `launch_request_id`); returns the first."""
        rows = [self._intent_row(s, launch, now) for _ in range(max(launch.nodes, 1))]
        if launch.gang is not None:
            for row in rows:
                row.launch_request_id, row.gang_id = rows[0].request_id, launch.gang
        return rows[0].id

    def _intent_row(self, s: Session, launch: Launch, now: datetime) -> Instance:
        pool = self.pools[launch.pool]
        o = launch.offering
        inst = Instance(
            request_id=new_id(),
            provider=pool.provider,
            pool=pool.name,
            instance_type=o.instance_type,
            capacity_type=o.capacity_type,
            zone=o.zone,
            region=pool.region,
            gpus=o.gpus,
            gpu_type=o.gpu_type,
            state=S.REQUESTED.value,
            team=launch.team,
            hourly_price=o.hourly_price,
            created_at=now,
            updated_at=now,
            smaller_machines=right_size.to_json(launch.smaller),
        )
        inst.id = new_id()  # what the column default would draw at the flush (same order of ids)
        s.add(inst)
        s.add(
            InstanceEvent(
                instance_id=inst.id,
                at=now,
                from_state=None,
                to_state=S.REQUESTED.value,
                reason=launch.reason[:255],
            )
        )
        note(
            s,
            "instance %s (pool %s): launch requested, %s %s for team %s: %s",
            inst.id,
            pool.name,
            o.capacity_type,
            o.instance_type,
            launch.team,
            launch.reason,
            instance_id=inst.id,
            pool=pool.name,
            team=launch.team,
        )
        return inst

    def _launch_batch(self, launches: list[Launch], now: datetime, result: CycleResult) -> None:
        """Threaded mode: every intent of the cycle in one transaction, all moved to
        `launching` (with their user-data) in a second, then every call submitted; the
        outcomes come back later. The intents are committed before any call, as always."""
        chosen = [
            launch for launch in launches if not ((b := self._state[launch.pool].backoff_until) is not None and b > now)
        ]
        if not chosen:
            return
        with transaction(self.sessions) as s:
            ids = [self._add_intent(s, launch, now) for launch in chosen]
        crash_point("after_intent")
        self._submit_launches(ids, now, result)

    def _resume_intents(self, now: datetime, result: CycleResult) -> None:
        """Intents left by a crash or a transient error: call again with the same request id
        (not those whose call is still in flight)."""
        with self.sessions() as s:
            stmt = select(Instance.id, Instance.pool).where(
                Instance.state.in_((S.REQUESTED.value, S.LAUNCHING.value)),
                Instance.provider_instance_id.is_(None),
            )
            ids = [(str(a), str(b)) for a, b in s.execute(stmt)]
        in_flight = self.executor.launching()
        todo: list[str] = []
        for inst_id, pool in ids:
            if inst_id in in_flight:
                continue
            st = self._state.get(pool)
            if st is not None and st.backoff_until is not None and st.backoff_until > now:
                continue
            todo.append(inst_id)
        if self.executor.inline:
            for inst_id in todo:
                self._call_launch(inst_id, now, result)
        elif todo:
            self._submit_launches(todo, now, result)

    def _call_launch(self, inst_id: str, now: datetime, result: CycleResult) -> bool:
        """Sync mode: one launch, its outcome applied at once. False when it failed."""
        self._failed_now.discard(inst_id)
        self._submit_launches([inst_id], now, result)
        return inst_id not in self._failed_now

    def _submit_launches(self, ids: list[str], now: datetime, result: CycleResult) -> None:
        """Move the intents to `launching` (one transaction) and submit their calls; the
        outcomes are applied by `_apply_launch`, now (sync mode) or in a later cycle.
        The rows of one gang launch are one call (`nodes` = its rows), submitted under
        its first row's id, whichever of its rows was asked for."""
        calls: list[tuple[str, Provider, LaunchRequest]] = []
        gangs_seen: set[str] = set()
        with transaction(self.sessions) as s, s.no_autoflush:
            rows = {i.id: i for i in s.scalars(select(Instance).where(Instance.id.in_(ids)))} if len(ids) > 1 else {}
            for inst_id in ids:
                inst = rows.get(inst_id) if rows else s.get(Instance, inst_id)
                if inst is None:
                    continue
                group = [inst]
                if inst.launch_request_id is not None:
                    if inst.launch_request_id in gangs_seen:
                        continue
                    gangs_seen.add(inst.launch_request_id)
                    group = gang_rows(s, inst.launch_request_id)
                    inst = next((r for r in group if r.request_id == r.launch_request_id), group[0])
                pending = [r for r in group if r.provider_instance_id is None and r.state in (S.REQUESTED, S.LAUNCHING)]
                if not pending:
                    continue
                pool = self.pools.get(inst.pool)
                provider = self.providers.get(inst.pool)
                if pool is None or provider is None:
                    for r in pending:
                        transition(s, r, S.LAUNCH_FAILED, reason=f"pool {inst.pool} has no provider", now=now)
                        self._failed_now.add(r.id)
                    continue
                for r in pending:
                    if r.state == S.REQUESTED:
                        transition(
                            s,
                            r,
                            S.LAUNCHING,
                            reason=f"calling {provider.name} with request id {inst.request_id}",
                            now=now,
                        )
                offering = self._offering_of(inst)
                nodes = len(group)
                user_data = self.user_data(s, pool, inst.request_id, nodes) if self.user_data else ""
                request = LaunchRequest(
                    request_id=inst.request_id,
                    pool=pool.name,
                    owner=self.config.deployment,
                    offering=offering,
                    image=pool.image,
                    user_data=user_data,
                    tags={TAG_TEAM: inst.team or "shared"},
                    nodes=nodes,
                    gang=inst.gang_id,
                )
                calls.append((inst.id, provider, request))
        for inst_id, provider, request in calls:
            crash_point("before_launch_submit")
            self.executor.submit_launch(provider, inst_id, request)
        self._apply_outcomes(now, result)

    def _apply_launch_error(self, done: LaunchDone, error: Exception, now: datetime, result: CycleResult) -> None:
        inst_id, request = done.row_id, done.request
        self._failed_now.add(inst_id)
        if isinstance(error, ProviderError):
            self._launch_failed(inst_id, request, error, now, result)
            return
        # A driver bug: keep the intent, retry with the same id.
        log.error("pool %s: launch raised unexpectedly: %r", request.pool, error)
        result.launch_errors.append(f"{request.pool} {request.offering.key}: {type(error).__name__}: {error}")

    def _apply_launch(
        self, s: Session, done: LaunchDone, now: datetime, result: CycleResult, after: list[Callable[[], None]]
    ) -> None:
        inst_id, request = done.row_id, done.request
        inst = s.get(Instance, inst_id)
        if inst is not None and inst.launch_request_id is not None:
            self._apply_gang_launch(s, done, inst.launch_request_id, now, result, after)
            return
        if not done.instances:
            if inst is not None and inst.state in (S.REQUESTED, S.LAUNCHING):
                transition(s, inst, S.LAUNCH_FAILED, reason="the provider started no instance", now=now)
            self._failed_now.add(inst_id)
            return
        first = done.instances[0]
        stray: str | None = None
        if inst is None:
            stray = first.instance_id
        elif inst.state in (S.REQUESTED, S.LAUNCHING):
            self._record_launched(s, inst, first, now, reason=f"launched as {first.instance_id}")
        elif inst.state not in (S.BOOTING, S.READY, S.DRAINING):  # (those: adopted by a listing meanwhile)
            # Given up while the call was in flight: the instance it started must not
            # outlive the row. Recorded, so a failed terminate is retried by the sync.
            if inst.provider_instance_id is None:
                inst.provider_instance_id = first.instance_id
            if inst.state in (S.TERMINATING, S.TERMINATED, S.LAUNCH_FAILED):
                stray = first.instance_id
        if stray is not None:
            log.warning(
                "pool %s: launch %s finished after its row was given up; terminating %s",
                request.pool,
                request.request_id,
                stray,
            )
            provider = self.providers.get(request.pool)
            if provider is not None:
                after.append(lambda: self.executor.submit_terminate(provider, request.pool, [stray]))
            return

        def done_ok() -> None:
            st = self._state.setdefault(request.pool, _PoolRuntime())
            st.failures, st.backoff_until = 0, None
            result.launched.append(inst_id)

        after.append(done_ok)

    def _apply_gang_launch(
        self,
        s: Session,
        done: LaunchDone,
        launch_request_id: str,
        now: datetime,
        result: CycleResult,
        after: list[Callable[[], None]],
    ) -> None:
        """A gang launch came back with its instances: each row still waiting takes one
        no row holds yet (a listing may have adopted some meanwhile). Instances no row
        wants (the rows were given up while the call was in flight) are terminated; rows
        left without one (a driver that started fewer) fail, and the planner asks again."""
        rows = gang_rows(s, launch_request_id)
        held = {r.provider_instance_id for r in rows if r.provider_instance_id}
        free = sorted((pi for pi in done.instances if pi.instance_id not in held), key=lambda pi: pi.instance_id)
        launched: list[str] = []
        for row in rows:
            if row.provider_instance_id is not None or row.state not in (S.REQUESTED, S.LAUNCHING):
                continue
            if not free:
                transition(
                    s,
                    row,
                    S.LAUNCH_FAILED,
                    reason=f"the gang launch {launch_request_id} started fewer machines than it has rows",
                    now=now,
                )
                self._failed_now.add(row.id)
                continue
            pi = free.pop(0)
            self._record_launched(s, row, pi, now, reason=f"launched as {pi.instance_id} (gang launch of {len(rows)})")
            launched.append(row.id)
        if free:
            stray = [pi.instance_id for pi in free]
            log.warning(
                "pool %s: gang launch %s finished after its rows were given up; terminating %s",
                done.request.pool,
                launch_request_id,
                ", ".join(stray),
            )
            provider = self.providers.get(done.request.pool)
            if provider is not None:
                after.append(lambda: self.executor.submit_terminate(provider, done.request.pool, stray))
        pool_name = done.request.pool

        def done_ok() -> None:
            st = self._state.setdefault(pool_name, _PoolRuntime())
            st.failures, st.backoff_until = 0, None
            result.launched.extend(launched)

        if launched:
            after.append(done_ok)

    def _record_launched(
        self, s: Session, inst: Instance, pi: ProviderInstance, now: datetime, reason: str, *, find_worker: bool = True
    ) -> None:
        inst.provider_instance_id = pi.instance_id
        inst.launched_at = inst.launched_at or pi.launched_at or now
        inst.zone = pi.zone or inst.zone
        transition(s, inst, S.BOOTING, reason=reason, now=now)
        for wid in expel_impostors(s, inst, now=now):
            log.warning(
                "pool %s: worker %s registered with launch %s's token as another instance",
                inst.pool,
                wid,
                inst.request_id,
            )
        if not find_worker:
            return  # the passive sync binds registered agents itself
        worker = s.scalar(
            select(Worker).where(
                Worker.instance_id == pi.instance_id,
                Worker.pool == inst.pool,
                Worker.state.in_(WORKER_LIVE),
            )
        )
        if worker is not None:
            inst.worker_id = worker.id
            transition(s, inst, S.READY, reason=f"agent registered as worker {worker.id}", now=now)

    def _launch_failed(
        self, inst_id: str, request: LaunchRequest, exc: ProviderError, now: datetime, result: CycleResult
    ) -> None:
        st = self._state[request.pool]
        st.failures += 1
        retry_after = exc.retry_after_s if isinstance(exc, RateLimited) else 0.0
        st.backoff_until = now + timedelta(seconds=backoff_delay(st.failures, retry_after_s=retry_after))
        pool = self.pools[request.pool]
        block = block_for(
            exc, request.offering, region=pool.region, now=now, ttl_s=self.config.reconcile.unavailable_ttl_s
        )
        what = f"{type(exc).__name__}: {exc.message}"
        result.launch_errors.append(f"{request.pool} {request.offering.key}: {what}")
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            assert inst is not None
            inst.last_error = what
            if inst.launch_request_id is not None:
                # A gang launch that raised is over, whatever the error: the driver rolled
                # back what it started, and a new attempt needs a new request id (the
                # clouds' idempotency keys would replay this one). Every row fails; the
                # planner asks again with new rows.
                for row in gang_rows(s, inst.launch_request_id):
                    row.last_error = what
                    if row.state in (S.REQUESTED, S.LAUNCHING) and row.provider_instance_id is None:
                        transition(s, row, S.LAUNCH_FAILED, reason=what, now=now)
                        self._failed_now.add(row.id)
            if block is not None:
                s.add(
                    OfferingBlock(
                        provider=pool.provider,
                        pool=pool.name,
                        scope=block.scope,
                        key=block.key,
                        reason=what[:1000],
                        until=block.until,
                    )
                )
            if exc.retryable or inst.state not in (S.REQUESTED, S.LAUNCHING) or inst.launch_request_id is not None:
                # Throttled or transient: the intent stays and is retried with the same id
                # (or the row was given up while the call was in flight).
                return
            transition(s, inst, S.LAUNCH_FAILED, reason=what, now=now)

    def _offering_of(self, inst: Instance) -> Offering:
        for o in self._state[inst.pool].offerings:
            if (o.instance_type, o.capacity_type, o.zone) == (
                inst.instance_type,
                inst.capacity_type,
                inst.zone,
            ):
                return Offering(
                    o.instance_type,
                    cast(CapacityType, o.capacity_type),
                    o.zone,
                    o.gpus,
                    o.gpu_type,
                    o.cpus,
                    o.memory_mb,
                    o.hourly_price,
                    inst.region,
                )
        return Offering(
            inst.instance_type,
            cast(CapacityType, inst.capacity_type),
            inst.zone,
            inst.gpus,
            inst.gpu_type,
            1,
            1024,
            inst.hourly_price,
            inst.region,
        )


def _max_gang_nodes(provider: Provider | None) -> int | None:
    return provider.capabilities.max_gang_nodes if provider is not None else None


def _with_static_capacity(pin: PolicyInput, snap: Snapshot) -> PolicyInput:
    """Static pools have workers but no instance rows: count their live workers as the
    pool's instances, and the idle ones as `idle_instances`, so the policy's on-prem-first
    rule sees idle on-prem machines (it holds cloud growth while they cover the backlog)."""
    static = {p.name for p in snap.pools if p.static}
    if not static:
        return pin
    live: Counter[str] = Counter()
    idle: Counter[str] = Counter()
    for w in snap.workers:
        if w.pool in static and w.state in WORKER_LEASABLE:
            live[w.pool] += 1
            if w.state == "idle" and w.running_tasks == 0:
                idle[w.pool] += 1
    pools = [
        p.model_copy(update={"current_instances": live[p.name], "idle_instances": idle[p.name]})
        if p.name in static
        else p
        for p in pin.pools
    ]
    return pin.model_copy(update={"pools": pools})
