"""One reconcile cycle: observe -> evaluate the policy -> plan -> act -> record.

`Reconciler.run_cycle()` is the whole loop body; the server calls it from APScheduler
and the simulator calls it in a loop with a virtual clock. It reads time only from the
injected clock, never sleeps, and talks to clouds only through `providers`.

Safety rules carried out here (the planner decides *what*, this module *how*):

- **Launch intent first.** An `Instance` row with a fresh request id is committed
  before the provider is called, and the id is the provider's idempotency key. After a
  crash, an intent whose request id shows up in the provider's listing is adopted; one
  that does not is launched again with the *same* id, which the provider answers with
  the instance of the first call if there was one. So a launch is never doubled.
- **Passive sync before active transitions.** Listings adopt, confirm termination,
  notice preemption and loss, and find orphans (our owner tag, no record, older than the
  grace period), all before the plan is made.
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
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.admission import store as admission_store
from autoscaler.admission.model import admissions
from autoscaler.clock import Clock
from autoscaler.config import AutoscalerConfig, PoolConfig
from autoscaler.errors import Conflict
from autoscaler.ledger.spend import shared_pools
from autoscaler.planner import Plan, plan
from autoscaler.planner.model import Launch, OfferingView
from autoscaler.policy.schema import Decision, EvaluationResult, PolicyEngine, PolicyInput
from autoscaler.queueing.workers import drain as drain_worker
from autoscaler.queueing.workers import expire_silent_workers, interruption_notice
from autoscaler.reconciler.crashpoints import crash_point
from autoscaler.reconciler.errors import backoff_delay, block_for
from autoscaler.reconciler.record import record_cycle
from autoscaler.reconciler.snapshot import PoolState, Snapshot, observe, policy_input
from autoscaler.reconciler.states import InstanceState, transition
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, InstanceEvent, OfferingBlock, Worker, new_id
from providers.base import (
    TAG_POOL,
    TAG_TEAM,
    CapacityType,
    InstanceStatus,
    InterruptionSource,
    LaunchRequest,
    Offering,
    Provider,
    ProviderError,
    ProviderInstance,
    RateLimited,
)

log = logging.getLogger(__name__)
S = InstanceState
OFFERINGS_TTL_S = 600.0
# Renders the user-data for one launch (creating its one-time join token in `session`).
UserData = Callable[[Session, PoolConfig, str], str]


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
        self.last_result: CycleResult | None = None

    # ------------------------------------------------------------------ the cycle

    def run_cycle(self) -> CycleResult:
        t0 = self.perf()
        now = self.clock.now()
        timings: dict[str, float] = {}
        self._refresh_offerings(now)
        listings = self._list_providers()
        with transaction(self.sessions) as s:
            expire_silent_workers(s, now=now, timeout_s=self.config.reconcile.heartbeat_timeout_s)
        result = CycleResult(at=now, plan=Plan())
        with transaction(self.sessions) as s:
            to_terminate = self._sync(s, listings, now, result)
        self._terminate_provider_ids(to_terminate)
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
            spent[launch.team] += launch.offering.hourly_price
        with transaction(self.sessions) as s:
            admission_store.write(s, admissions(evaluation.decision, spent), now=now)
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
            )
        if history:
            self._last_history = now
        self._last_accrual = now
        self.last_result = result
        return result

    def observe(self, now: datetime) -> Snapshot:
        pool_state = {name: PoolState(st.offerings, st.backoff_until) for name, st in self._state.items()}
        with self.sessions() as s:
            return observe(s, self.config, now=now, pool_state=pool_state)

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

    def _list_providers(self) -> dict[str, list[ProviderInstance]]:
        """Each pool's listing; a pool whose listing fails is left out (nothing is judged lost)."""
        out: dict[str, list[ProviderInstance]] = {}
        for name, provider in self.providers.items():
            try:
                listed = provider.list(self.config.deployment)
            except ProviderError as exc:
                log.warning("pool %s: listing failed (%s); skipping its sync this cycle", name, exc.message)
                continue
            out[name] = [pi for pi in listed if (pi.pool or pi.tags.get(TAG_POOL, name)) == name]
        return out

    def _sync(
        self, s: Session, listings: Mapping[str, list[ProviderInstance]], now: datetime, result: CycleResult
    ) -> list[tuple[str, str]]:
        """Passive transitions from listings and registrations. Returns (pool, provider id)
        pairs to terminate: orphans and instances we are still waiting to see gone."""
        open_rows = list(s.scalars(select(Instance).where(Instance.state.not_in(("terminated", "launch_failed")))))
        grace = timedelta(seconds=self.config.reconcile.orphan_grace_s)
        to_terminate: list[tuple[str, str]] = []
        by_pool: dict[str, list[Instance]] = {}
        for inst in open_rows:
            by_pool.setdefault(inst.pool, []).append(inst)
        for pool_name, listed in listings.items():
            if self.providers[pool_name].capabilities.static:
                self._static_machines(s, pool_name, listed, result)
                continue
            by_id = {pi.instance_id: pi for pi in listed}
            by_request = {pi.request_id: pi for pi in listed if pi.request_id}
            for inst in by_pool.get(pool_name, []):
                pi = (
                    by_id.get(inst.provider_instance_id)
                    if inst.provider_instance_id
                    else by_request.get(inst.request_id)
                )
                state = S(inst.state)
                if state in (S.REQUESTED, S.LAUNCHING):
                    if pi is not None:
                        self._record_launched(
                            s,
                            inst,
                            pi,
                            now,
                            reason="adopted: the provider lists an instance with this launch's request id",
                        )
                        result.adopted.append(inst.id)
                    continue
                if state == S.TERMINATING:
                    if pi is None or pi.status == InstanceStatus.TERMINATED:
                        transition(s, inst, S.TERMINATED, reason="the provider no longer lists it", now=now)
                        if inst.terminated_at is None:
                            inst.terminated_at = now
                    elif inst.provider_instance_id:
                        to_terminate.append((pool_name, inst.provider_instance_id))
                    continue
                if state not in (S.BOOTING, S.READY, S.DRAINING):
                    continue
                if pi is not None and pi.status == InstanceStatus.PREEMPTED:
                    transition(s, inst, S.PREEMPTED, reason="the provider reclaimed the spot capacity", now=now)
                    result.preempted.append(inst.id)
                elif pi is None or pi.status == InstanceStatus.TERMINATED:
                    first = self._missing_since.setdefault(inst.id, now)
                    launched = inst.launched_at or inst.created_at
                    if now - first >= grace and now - launched >= grace:
                        transition(s, inst, S.LOST, reason="the provider no longer lists it", now=now)
                        result.lost.append(inst.id)
                        self._missing_since.pop(inst.id, None)
                else:
                    self._missing_since.pop(inst.id, None)
            # Orphans: tagged with our owner, in this pool, and no open record.
            known = {i.request_id for i in by_pool.get(pool_name, [])}
            known_ids = {i.provider_instance_id for i in by_pool.get(pool_name, []) if i.provider_instance_id}
            for pi in listed:
                if pi.instance_id in known_ids or (pi.request_id and pi.request_id in known):
                    self._orphan_seen.pop(pi.instance_id, None)
                    continue
                if pi.status in (InstanceStatus.TERMINATED, InstanceStatus.STOPPING):
                    continue
                seen = self._orphan_seen.setdefault(pi.instance_id, now)
                born = pi.launched_at or seen
                if now - born >= grace and now - seen >= timedelta(0):
                    to_terminate.append((pool_name, pi.instance_id))
                    result.orphans.append(pi.instance_id)
                    self._orphan_seen.pop(pi.instance_id, None)
                    log.warning(
                        "pool %s: terminating orphan %s (owner tag %s, no record)",
                        pool_name,
                        pi.instance_id,
                        self.config.deployment,
                    )
        self._sync_workers(s, open_rows, now)
        self._interruptions(s, open_rows, now)
        return to_terminate

    def _static_machines(self, s: Session, pool_name: str, listed: list[ProviderInstance], result: CycleResult) -> None:
        """Declared on-prem machines are not ours to adopt, lose or orphan (no instance rows,
        so the planner can never terminate one); only say which have no agent running."""
        live = set(
            s.scalars(
                select(Worker.instance_id).where(
                    Worker.pool == pool_name, Worker.state.in_(("idle", "busy", "draining"))
                )
            )
        )
        silent = frozenset(pi.instance_id for pi in listed if pi.instance_id not in live)
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

    def _sync_workers(self, s: Session, rows: list[Instance], now: datetime) -> None:
        """Booting instances whose agent registered become ready."""
        waiting = {
            (i.pool, i.provider_instance_id): i
            for i in rows
            if i.state in ("requested", "launching", "booting") and i.provider_instance_id
        }
        with_worker = [i for i in rows if i.state in ("launching", "booting") and i.worker_id]
        if waiting:
            for w in s.scalars(
                select(Worker).where(
                    Worker.state.in_(("idle", "busy", "draining")),
                    Worker.instance_id.in_([k[1] for k in waiting]),
                )
            ):
                inst = waiting.get((w.pool, w.instance_id))
                if inst is not None and inst.worker_id is None:
                    inst.worker_id = w.id
                    with_worker.append(inst)
        for inst in with_worker:
            if inst.state == S.BOOTING:
                transition(s, inst, S.READY, reason=f"agent registered as worker {inst.worker_id}", now=now)

    def _interruptions(self, s: Session, rows: list[Instance], now: datetime) -> None:
        """Provider notices: a spot interruption (reclaim in ~2 min) drains at once with the
        notice's deadline; a rebalance recommendation stops new leases (`queueing.workers`)."""
        by_pid = {(i.pool, i.provider_instance_id): i for i in rows if i.provider_instance_id}
        rebalance_s = self.config.reconcile.rebalance_drain_deadline_s
        for pool_name, provider in self.providers.items():
            if not provider.capabilities.interruption_events or not isinstance(provider, InterruptionSource):
                continue
            try:
                events = provider.interruptions()
            except ProviderError:
                continue
            for ev in events:
                inst = by_pid.get((pool_name, ev.instance_id))
                if inst is not None:
                    interruption_notice(
                        s, inst, ev.kind, ev.deadline, ev.detail, now=now, rebalance_deadline_s=rebalance_s
                    )

    def _terminate_provider_ids(self, pairs: list[tuple[str, str]]) -> None:
        by_pool: dict[str, list[str]] = {}
        for pool_name, pid in pairs:
            by_pool.setdefault(pool_name, []).append(pid)
        for pool_name, ids in by_pool.items():
            try:
                self.providers[pool_name].terminate(ids)
            except ProviderError as exc:
                log.warning("pool %s: terminate %s failed (%s); will retry", pool_name, ids, exc.message)

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

    def _terminate(self, inst_id: str, reason: str, mark: str | None, now: datetime, result: CycleResult) -> None:
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            if inst is None or inst.state in ("terminated", "launch_failed", "terminating"):
                return
            if mark and inst.state != mark:
                transition(s, inst, S(mark), reason=reason, now=now)
            transition(s, inst, S.TERMINATING, reason=reason, now=now)
            pid, pool = inst.provider_instance_id, inst.pool
        crash_point("after_terminate_intent")
        provider = self.providers.get(pool)
        if pid is not None and provider is not None:
            try:
                provider.terminate([pid])
            except ProviderError as exc:
                log.warning("terminate %s failed (%s); the next cycle retries", pid, exc.message)
                return
            crash_point("after_terminate_call")
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            if inst is not None and inst.state == S.TERMINATING:
                transition(s, inst, S.TERMINATED, reason="terminated", now=now)
                inst.terminated_at = now
        result.terminated.append(inst_id)

    def _write_intent(self, launch: Launch, now: datetime) -> str:
        """Commit the launch intent; the provider is called only after this returns."""
        pool = self.pools[launch.pool]
        o = launch.offering
        with transaction(self.sessions) as s:
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
            )
            s.add(inst)
            s.flush()
            s.add(
                InstanceEvent(
                    instance_id=inst.id,
                    at=now,
                    from_state=None,
                    to_state=S.REQUESTED.value,
                    reason=launch.reason[:255],
                )
            )
            return inst.id

    def _resume_intents(self, now: datetime, result: CycleResult) -> None:
        """Intents left by a crash or a transient error: call again with the same request id."""
        with self.sessions() as s:
            stmt = select(Instance.id, Instance.pool).where(
                Instance.state.in_((S.REQUESTED.value, S.LAUNCHING.value)),
                Instance.provider_instance_id.is_(None),
            )
            ids = [(str(a), str(b)) for a, b in s.execute(stmt)]
        for inst_id, pool in ids:
            st = self._state.get(pool)
            if st is not None and st.backoff_until is not None and st.backoff_until > now:
                continue
            self._call_launch(inst_id, now, result)

    def _call_launch(self, inst_id: str, now: datetime, result: CycleResult) -> bool:
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            if inst is None or inst.provider_instance_id is not None:
                return True
            pool = self.pools.get(inst.pool)
            provider = self.providers.get(inst.pool)
            if pool is None or provider is None:
                transition(s, inst, S.LAUNCH_FAILED, reason=f"pool {inst.pool} has no provider", now=now)
                return False
            if inst.state == S.REQUESTED:
                transition(
                    s,
                    inst,
                    S.LAUNCHING,
                    reason=f"calling {provider.name} with request id {inst.request_id}",
                    now=now,
                )
            offering = self._offering_of(inst)
            user_data = self.user_data(s, pool, inst.request_id) if self.user_data else ""
            request = LaunchRequest(
                request_id=inst.request_id,
                pool=pool.name,
                owner=self.config.deployment,
                offering=offering,
                image=pool.image,
                user_data=user_data,
                tags={TAG_TEAM: inst.team or "shared"},
            )
        st = self._state[request.pool]
        try:
            launched = provider.launch(request)
            crash_point("after_provider_call")
        except ProviderError as exc:
            self._launch_failed(inst_id, request, exc, now, result)
            return False
        except Exception as exc:  # a driver bug: keep the intent, retry with the same id
            log.exception("pool %s: launch raised unexpectedly", request.pool)
            result.launch_errors.append(f"{request.pool} {offering.key}: {type(exc).__name__}: {exc}")
            return False
        with transaction(self.sessions) as s:
            inst = s.get(Instance, inst_id)
            assert inst is not None
            if not launched:
                transition(s, inst, S.LAUNCH_FAILED, reason="the provider started no instance", now=now)
                return False
            self._record_launched(s, inst, launched[0], now, reason=f"launched as {launched[0].instance_id}")
        st.failures, st.backoff_until = 0, None
        result.launched.append(inst_id)
        return True

    def _record_launched(self, s: Session, inst: Instance, pi: ProviderInstance, now: datetime, reason: str) -> None:
        inst.provider_instance_id = pi.instance_id
        inst.launched_at = inst.launched_at or pi.launched_at or now
        inst.zone = pi.zone or inst.zone
        transition(s, inst, S.BOOTING, reason=reason, now=now)
        worker = s.scalar(
            select(Worker).where(
                Worker.instance_id == pi.instance_id,
                Worker.pool == inst.pool,
                Worker.state.in_(("idle", "busy", "draining")),
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
            if exc.retryable:
                # Throttled or transient: the intent stays and is retried with the same id.
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
        if w.pool in static and w.state in ("idle", "busy"):
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
