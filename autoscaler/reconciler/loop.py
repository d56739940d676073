"""Timing: the reconcile job run by APScheduler every `interval_s`, and the debounced
waker that pulls the next run forward when work arrives.

`wake(reason)` moves the job's next run to `now + debounce_s` unless it is already due
sooner, so a burst of enqueues within the debounce window costs one cycle, and a new
task is planned about a second after it arrives instead of up to an interval later.
A wake that arrives while a cycle runs is remembered and answered right after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any, Protocol

from autoscaler.clock import Clock
from autoscaler.reconciler.cycle import CycleResult, Reconciler
from autoscaler.reconciler.leader import LeaderLock

log = logging.getLogger(__name__)
JOB_ID = "reconcile"


def next_run_after_wake(current: datetime | None, now: datetime, debounce_s: float) -> datetime:
    """The job's next run after a wake: never later than it already was (pure)."""
    wanted = now + timedelta(seconds=debounce_s)
    return wanted if current is None or current > wanted else current


class Scheduler(Protocol):
    def get_job(self, job_id: str) -> Any: ...

    def modify_job(self, job_id: str, **changes: Any) -> Any: ...


class ReconcileLoop:
    """Runs cycles when this process is the leader; owns the waker."""

    def __init__(self, reconciler: Reconciler, lock: LeaderLock, clock: Clock, *, debounce_s: float) -> None:
        self.reconciler = reconciler
        self.lock = lock
        self.clock = clock
        self.debounce_s = debounce_s
        self.scheduler: Scheduler | None = None
        self._running = threading.Lock()
        self._woken_during_run = False
        self.on_cycle: list[Callable[[CycleResult], None]] = []

    def tick(self) -> CycleResult | None:
        """One scheduled run: a cycle if we lead, nothing if we stand by."""
        if not self.lock.acquire():
            return None
        with self._running:
            self._woken_during_run = False
            try:
                result = self.reconciler.run_cycle()
            except Exception:
                log.exception("reconcile cycle failed; the next one retries")
                return None
        for hook in self.on_cycle:
            hook(result)
        if self._woken_during_run:
            self.wake("woken during the last cycle")
        return result

    def wake(self, reason: str) -> None:
        if self._running.locked():
            self._woken_during_run = True
        if self.scheduler is None:
            return
        try:
            job = self.scheduler.get_job(JOB_ID)
            if job is None:
                return
            when = next_run_after_wake(job.next_run_time, self.clock.now(), self.debounce_s)
            if when != job.next_run_time:
                self.scheduler.modify_job(JOB_ID, next_run_time=when)
                log.debug("reconcile woken (%s): next run at %s", reason, when)
        except Exception:
            log.exception("could not wake the reconciler")
