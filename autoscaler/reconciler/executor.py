"""Provider actions (launch, terminate) run off the cycle and report back as outcomes.

The cycle commits an intent (a launch's `Instance` row with its request id, or the
row's move to `terminating`) and *then* submits the call; it never waits on a cloud
operation. Each outcome (the instances launched, or the error) is queued; the next
cycle (or the wake an outcome triggers) applies it in a short transaction, as Ray's
`launch` + `poll_errors` do. A crash while a call is in flight loses nothing: the
intent is committed, and the next process resumes it with the same request id (the
provider's idempotency key) or adopts what the listing shows.

Two modes:

- `ThreadedExecutor`: a bounded thread pool per pool (provider), used by
  `autoscaler up`. Threads only call the provider, never the database.
- `SyncExecutor`: runs each call at submit time, in the caller's thread; the cycle
  applies the outcome right away, so a launch is recorded within the cycle that made
  it, deterministically. The simulator and most tests use it (the default).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from autoscaler.reconciler.crashpoints import crash_point
from providers.base import LaunchRequest, Provider, ProviderInstance

log = logging.getLogger(__name__)
DEFAULT_CONCURRENCY = 128


@dataclass(frozen=True)
class LaunchDone:
    row_id: str
    request: LaunchRequest
    instances: tuple[ProviderInstance, ...] = ()
    error: Exception | None = None


@dataclass(frozen=True)
class TerminateDone:
    pool: str
    provider_ids: tuple[str, ...]
    # Rows to mark `terminated` once the provider accepted (empty for sync's re-terminations
    # and orphans: the listing confirms those).
    row_ids: tuple[str, ...] = ()
    error: Exception | None = None


Outcome = LaunchDone | TerminateDone


class Executor(Protocol):
    # True: each call runs at submit time and its outcome is applied at once (sync mode).
    inline: bool

    def submit_launch(self, provider: Provider, row_id: str, request: LaunchRequest) -> None: ...

    def submit_terminate(
        self, provider: Provider, pool: str, provider_ids: Sequence[str], row_ids: Sequence[str] = ()
    ) -> None: ...

    def outcomes(self) -> list[Outcome]:
        """Outcomes completed since the last call, in completion order (never blocks)."""
        ...

    def launching(self) -> frozenset[str]:
        """Row ids whose launch call is in flight."""
        ...

    def terminating(self) -> frozenset[tuple[str, str]]:
        """(pool, provider id) pairs whose terminate call is in flight."""
        ...

    def close(self) -> None: ...


def _launch(provider: Provider, row_id: str, request: LaunchRequest) -> LaunchDone:
    try:
        launched = provider.launch(request)
    except Exception as exc:  # ProviderError, or a driver bug: the applier tells them apart
        return LaunchDone(row_id, request, error=exc)
    crash_point("after_provider_call")
    return LaunchDone(row_id, request, instances=tuple(launched))


def _terminate(provider: Provider, pool: str, ids: tuple[str, ...], row_ids: tuple[str, ...]) -> TerminateDone:
    try:
        provider.terminate(list(ids))
    except Exception as exc:
        return TerminateDone(pool, ids, row_ids, error=exc)
    crash_point("after_terminate_call")
    return TerminateDone(pool, ids, row_ids)


class SyncExecutor:
    """Each call runs when submitted; its outcome is ready at once."""

    inline = True

    def __init__(self) -> None:
        self._done: list[Outcome] = []

    def submit_launch(self, provider: Provider, row_id: str, request: LaunchRequest) -> None:
        self._done.append(_launch(provider, row_id, request))

    def submit_terminate(
        self, provider: Provider, pool: str, provider_ids: Sequence[str], row_ids: Sequence[str] = ()
    ) -> None:
        self._done.append(_terminate(provider, pool, tuple(provider_ids), tuple(row_ids)))

    def outcomes(self) -> list[Outcome]:
        done, self._done = self._done, []
        return done

    def launching(self) -> frozenset[str]:
        return frozenset()

    def terminating(self) -> frozenset[tuple[str, str]]:
        return frozenset()

    def close(self) -> None:
        pass


class ThreadedExecutor:
    """A bounded thread pool per pool; `on_result` (e.g. the loop's wake) is called from
    the worker thread after each outcome is queued."""

    inline = False

    def __init__(self, *, concurrency: int = DEFAULT_CONCURRENCY, on_result: Callable[[], None] | None = None) -> None:
        self.concurrency = concurrency
        self.on_result = on_result
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._done: list[Outcome] = []
        self._launching: set[str] = set()
        self._terminating: set[tuple[str, str]] = set()
        self._running = 0  # calls submitted and not finished
        self._idle = threading.Condition(self._lock)

    def _pool(self, name: str) -> ThreadPoolExecutor:
        pool = self._pools.get(name)
        if pool is None:
            pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix=f"provider-{name}")
            self._pools[name] = pool
        return pool

    def submit_launch(self, provider: Provider, row_id: str, request: LaunchRequest) -> None:
        with self._lock:
            if row_id in self._launching:
                return
            self._launching.add(row_id)
            self._running += 1
        future = self._pool(request.pool).submit(_launch, provider, row_id, request)
        future.add_done_callback(lambda f: self._finish(f, launch=row_id))

    def submit_terminate(
        self, provider: Provider, pool: str, provider_ids: Sequence[str], row_ids: Sequence[str] = ()
    ) -> None:
        with self._lock:
            ids = tuple(i for i in provider_ids if (pool, i) not in self._terminating)
            if not ids:
                return
            self._terminating.update((pool, i) for i in ids)
            self._running += 1
        future = self._pool(pool).submit(_terminate, provider, pool, ids, tuple(row_ids))
        future.add_done_callback(lambda f: self._finish(f, terminate=(pool, ids, tuple(row_ids))))

    def _finish(
        self,
        future: Future[Any],
        *,
        launch: str | None = None,
        terminate: tuple[str, tuple[str, ...], tuple[str, ...]] | None = None,
    ) -> None:
        exc: BaseException | None = Exception("cancelled") if future.cancelled() else future.exception()
        outcome: Outcome | None = None
        if exc is None:
            outcome = future.result()
        elif launch is not None:
            log.error("launch of %s died in its thread: %r", launch, exc)
        elif terminate is not None:
            outcome = TerminateDone(terminate[0], terminate[1], terminate[2], error=Exception(repr(exc)))
        with self._lock:
            self._running -= 1
            if outcome is not None:
                # Still counted in flight until `outcomes()` hands it over, so a cycle
                # never resubmits a call whose outcome waits to be applied.
                self._done.append(outcome)
            else:
                if launch is not None:
                    self._launching.discard(launch)
                if terminate is not None:
                    self._terminating.difference_update((terminate[0], i) for i in terminate[1])
            self._idle.notify_all()
        if self.on_result is not None:
            try:
                self.on_result()
            except Exception:
                log.exception("on_result callback failed")

    def outcomes(self) -> list[Outcome]:
        with self._lock:
            done, self._done = self._done, []
            for o in done:
                if isinstance(o, LaunchDone):
                    self._launching.discard(o.row_id)
                else:
                    self._terminating.difference_update((o.pool, i) for i in o.provider_ids)
        return done

    def launching(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._launching)

    def terminating(self) -> frozenset[tuple[str, str]]:
        with self._lock:
            return frozenset(self._terminating)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block until every submitted call has finished (tests, benchmarks); False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: self._running == 0, timeout=timeout_s)

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
