"""An in-memory provider for tests and the simulator.

It honours the whole contract of `providers.base` (idempotent launch by request id,
terminate of a gone instance succeeds, typed errors) and adds the knobs a test or a
simulation needs, all deterministic and driven by an injected clock, never by threads
or sleeps (except `op_delay_s`, off by default):

- every call is recorded in `calls` (method, argument, time);
- `fail_next(error)` / `fail_when(match, error)` inject errors for chosen calls;
- `set_capacity(offering_key, n)` limits how many instances of an offering may run at
  once (a launch past the limit raises a `CapacityError`, as a cloud out of capacity);
- `boot_delay_s`: an instance is `PENDING` until that long after its launch;
- `list_lag_s`: listings lag launches and terminations (eventual consistency);
- `preempt(instance_id)` / `schedule_preemption(instance_id, at)`: spot reclaims, each
  announced once through `interruptions()` and listed as `PREEMPTED` until terminated;
- `op_delay_s`: each `launch` and `terminate` takes that long in real time (a cloud's
  seconds per operation; `sleep` is injectable), so tests and benchmarks can show what
  the reconciler does while calls are in flight. Calls may come from several threads
  at once: the provider's state is guarded by a lock, and the delays overlap.
"""

from __future__ import annotations

import builtins
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from providers.base import (
    Capabilities,
    CapacityError,
    DriverOptions,
    InstanceStatus,
    InterruptionEvent,
    LaunchRequest,
    Offering,
    ProviderError,
    ProviderInstance,
    Scope,
)

Method = Literal["offerings", "launch", "list", "terminate"]
Now = Callable[[], datetime]


def _wall_clock() -> datetime:
    return datetime.now(UTC)


# The tag on each machine of a gang launch (`LaunchRequest.gang`).
GANG_TAG = "autoscaler-gang"


@dataclass(frozen=True)
class Call:
    """One recorded call: `arg` is the LaunchRequest, the owner, or the tuple of ids."""

    method: Method
    arg: Any
    at: datetime


@dataclass
class FaultRule:
    """Raise `error` on calls of `method` whose argument `match`es, `times` times (None = always)."""

    method: Method
    error: ProviderError
    times: int | None = 1
    match: Callable[[Any], bool] | None = None

    def applies(self, method: Method, arg: Any) -> bool:
        if method != self.method or self.times == 0:
            return False
        return self.match is None or self.match(arg)


@dataclass
class FakeInstance:
    """The provider's own record of one instance (mutable; listings get frozen copies)."""

    instance_id: str
    request: LaunchRequest
    launched_at: datetime
    # Set once the instance is terminated or reclaimed; listings honour list_lag_s.
    terminated_at: datetime | None = None
    preempted_at: datetime | None = None
    preempt_at: datetime | None = None
    notice_s: float = 120.0
    notice_sent: bool = False
    zone: str | None = None
    tags: dict[str, str] = field(default_factory=dict)


class FakeOptions(DriverOptions):
    """A fake pool takes no `options:`; its knobs are constructor arguments for tests."""


class FakeProvider:
    """See the module docstring. Construct with the offerings the pool may launch."""

    def __init__(
        self,
        offerings: Sequence[Offering],
        *,
        name: str = "fake",
        clock: Now | None = None,
        boot_delay_s: float = 0.0,
        list_lag_s: float = 0.0,
        capabilities: Capabilities | None = None,
        record_calls: bool = True,
        id_prefix: str = "fake-",
        op_delay_s: float = 0.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.name = name
        self.capabilities = capabilities or Capabilities(interruption_events=True)
        self._offerings = list(offerings)
        self._now = clock or _wall_clock
        self.boot_delay_s = boot_delay_s
        self.list_lag_s = list_lag_s
        self.record_calls = record_calls
        self.op_delay_s = op_delay_s
        self._sleep = sleep
        self._lock = threading.RLock()
        self.calls: list[Call] = []
        self.instances: dict[str, FakeInstance] = {}
        self._by_request: dict[str, list[str]] = {}
        self._faults: list[FaultRule] = []
        self._capacity: dict[str, int] = {}
        self._pending_events: list[InterruptionEvent] = []
        # Instances with a future preemption, so a listing does not scan every instance.
        self._scheduled: set[str] = set()
        # (`builtins.list` below: the protocol's method named `list` shadows the builtin.)
        self._ids = (f"{id_prefix}{n:06d}" for n in itertools.count(1))

    # ---- test and simulation knobs -------------------------------------------------

    def fail_next(self, error: ProviderError, *, method: Method = "launch", times: int = 1) -> None:
        """The next `times` calls of `method` raise `error`."""
        self._faults.append(FaultRule(method, error, times))

    def fail_when(
        self,
        match: Callable[[Any], bool],
        error: ProviderError,
        *,
        method: Method = "launch",
        times: int | None = None,
    ) -> FaultRule:
        """Calls of `method` whose argument matches raise `error` (e.g. every spot launch)."""
        rule = FaultRule(method, error, times, match)
        self._faults.append(rule)
        return rule

    def clear_faults(self) -> None:
        self._faults.clear()

    def set_capacity(self, offering_key: str, count: int | None) -> None:
        """At most `count` live instances of this offering (None = unlimited)."""
        if count is None:
            self._capacity.pop(offering_key, None)
        else:
            self._capacity[offering_key] = count

    def preempt(self, instance_id: str) -> None:
        """Reclaim a running instance now, as a spot interruption would."""
        inst = self.instances[instance_id]
        if inst.terminated_at is not None:
            return
        now = self._now()
        inst.preempted_at = inst.terminated_at = now
        self._pending_events.append(InterruptionEvent(instance_id, "interruption", now, deadline=now))

    def schedule_preemption(self, instance_id: str, at: datetime, *, notice_s: float = 120.0) -> None:
        """Reclaim at `at`; the notice becomes visible `notice_s` earlier."""
        inst = self.instances[instance_id]
        inst.preempt_at, inst.notice_s, inst.notice_sent = at, notice_s, False
        self._scheduled.add(instance_id)

    def calls_of(self, method: Method) -> list[Call]:
        return [c for c in self.calls if c.method == method]

    def live(self) -> list[FakeInstance]:
        """Instances not yet terminated, as the provider knows them (no listing lag)."""
        with self._lock:
            self._apply_schedule()
            return [i for i in self.instances.values() if i.terminated_at is None]

    # ---- the Provider protocol -----------------------------------------------------

    def offerings(self) -> list[Offering]:
        self._enter("offerings", None)
        return list(self._offerings)

    def launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        if self.op_delay_s:
            self._sleep(self.op_delay_s)
        with self._lock:
            return self._launch(request)

    def _launch(self, request: LaunchRequest) -> list[ProviderInstance]:
        self._enter("launch", request)
        known = self._by_request.get(request.request_id)
        if known is not None:
            return [self._view(self.instances[i]) for i in known]
        offering = request.offering
        nodes = max(request.nodes, 1)
        limit = self._capacity.get(offering.key)
        if limit is not None:
            in_use = sum(1 for i in self.live() if i.request.offering.key == offering.key)
            # A gang's machines are launched all or nothing: capacity for fewer than
            # all of them launches none.
            if in_use + nodes > limit:
                raise CapacityError(
                    f"no {offering.capacity_type} capacity for {nodes} x {offering.instance_type} "
                    f"in {offering.zone or '-'}",
                    scope=Scope.OFFERING,
                    code="InsufficientInstanceCapacity",
                )
        tags = request.all_tags()
        if request.gang is not None:
            tags[GANG_TAG] = request.gang
        made = []
        for _ in range(nodes):
            inst = FakeInstance(
                instance_id=next(self._ids),
                request=request,
                launched_at=self._now(),
                zone=offering.zone,
                tags=dict(tags),
            )
            self.instances[inst.instance_id] = inst
            made.append(inst)
        self._by_request[request.request_id] = [i.instance_id for i in made]
        return [self._view(i) for i in made]

    def list(self, owner: str) -> list[ProviderInstance]:
        with self._lock:
            return self._list(owner)

    def _list(self, owner: str) -> builtins.list[ProviderInstance]:
        self._enter("list", owner)
        self._apply_schedule()
        now = self._now()
        lag = timedelta(seconds=self.list_lag_s)
        out: list[ProviderInstance] = []
        for inst in self.instances.values():
            if inst.request.owner != owner or inst.launched_at + lag > now:
                continue
            gone_visible = inst.terminated_at is not None and inst.terminated_at + lag <= now
            if gone_visible and inst.preempted_at is None:
                continue
            out.append(self._view(inst))
        return out

    def terminate(self, instance_ids: Sequence[str]) -> None:
        if self.op_delay_s:
            self._sleep(self.op_delay_s)
        with self._lock:
            self._terminate(instance_ids)

    def _terminate(self, instance_ids: Sequence[str]) -> None:
        self._enter("terminate", tuple(instance_ids))
        now = self._now()
        for iid in instance_ids:
            inst = self.instances.get(iid)
            if inst is None:
                continue  # already gone (or never ours): success, per the contract
            if inst.terminated_at is None:
                inst.terminated_at = now
            # A terminate acknowledges a preemption: it stops being listed.
            inst.preempted_at = None

    def interruptions(self) -> builtins.list[InterruptionEvent]:
        with self._lock:
            self._apply_schedule()
            events, self._pending_events = self._pending_events, []
            return events

    # ---- internals -----------------------------------------------------------------

    def _enter(self, method: Method, arg: Any) -> None:
        if self.record_calls:
            self.calls.append(Call(method, arg, self._now()))
        for rule in self._faults:
            if rule.applies(method, arg):
                if rule.times is not None:
                    rule.times -= 1
                self._faults = [r for r in self._faults if r.times != 0]
                raise rule.error

    def _apply_schedule(self) -> None:
        now = self._now()
        for iid in sorted(self._scheduled):
            inst = self.instances[iid]
            if inst.preempt_at is None or inst.terminated_at is not None:
                self._scheduled.discard(iid)
                continue
            notice_at = inst.preempt_at - timedelta(seconds=inst.notice_s)
            if now >= notice_at and not inst.notice_sent:
                inst.notice_sent = True
                self._pending_events.append(InterruptionEvent(iid, "interruption", notice_at, deadline=inst.preempt_at))
            if now >= inst.preempt_at:
                inst.preempted_at = inst.terminated_at = inst.preempt_at
                inst.preempt_at = None
                self._scheduled.discard(iid)

    def _status(self, inst: FakeInstance) -> InstanceStatus:
        if inst.preempted_at is not None:
            return InstanceStatus.PREEMPTED
        if inst.terminated_at is not None:
            return InstanceStatus.TERMINATED
        if self._now() < inst.launched_at + timedelta(seconds=self.boot_delay_s):
            return InstanceStatus.PENDING
        return InstanceStatus.RUNNING

    def _view(self, inst: FakeInstance) -> ProviderInstance:
        req = inst.request
        return ProviderInstance(
            instance_id=inst.instance_id,
            request_id=req.request_id,
            pool=req.pool,
            instance_type=req.offering.instance_type,
            capacity_type=req.offering.capacity_type,
            zone=inst.zone,
            status=self._status(inst),
            launched_at=inst.launched_at,
            tags=dict(inst.tags),
            private_ip=None,
        )


def with_status(instance: ProviderInstance, status: InstanceStatus) -> ProviderInstance:
    """A copy of a listed instance with another status (handy in reconciler tests)."""
    return replace(instance, status=status)


__all__ = ["Call", "FakeInstance", "FakeProvider", "FaultRule", "with_status"]
