"""Long-poll leases: idle agents wait in the server for work instead of polling.

An agent asks `POST /workers/{id}/lease?wait_s=N`; when nothing fits now, its
request parks here (holding no database connection and no thread) until one of:

- work appears in this process (an enqueue, a task requeued by a finish or a
  deregistration): `notify(n)` wakes the n longest-waiting requests, one per new
  task, so a single enqueue never wakes every idle agent at once;
- another process may have queued work (`autoscaler server --workers N`, the
  reconciler, housekeeping): a watcher probes the database every `recheck_s` with
  one cheap query for the whole process (not one per waiting agent) and, when work
  is queued, wakes at most the waiters a poll every `cooldown_s` would have tried
  (so a backlog that fits nobody costs what the old 5 s polling cost, not more);
- the wait runs out: the usual empty answer;
- the server stops: `close()` releases every waiter at once with the empty answer.

A woken request simply runs the ordinary lease again; what it selects is
`autoscaler.queueing.tasks.lease`'s business, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from autoscaler.queueing.states import TaskState
from autoscaler.state.models import Task

log = logging.getLogger(__name__)
RECHECK_S = 1.0  # how soon work queued by another process reaches a waiting agent
COOLDOWN_S = 5.0  # the old idle poll interval: the probe never retries a waiter faster on average


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[None]
    since: float = field(default_factory=time.monotonic)


class LeaseWaiters:
    """The lease requests of one server process that wait for work.

    `probe()` (run in a worker thread) returns how many tasks are queued, at most the
    limit it is given; None disables the cross-process watcher (tests, SQLite with one
    process still benefit from `notify`)."""

    def __init__(
        self,
        probe: Callable[[int], int] | None = None,
        *,
        recheck_s: float = RECHECK_S,
        cooldown_s: float = COOLDOWN_S,
    ) -> None:
        self._probe = probe
        self.recheck_s = recheck_s
        self.cooldown_s = cooldown_s
        self._waiters: deque[_Waiter] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._closed = threading.Event()
        self.probes = 0  # how many watcher probes ran (for tests and the profile)

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self, timeout_s: float) -> None:
        """Until woken, `timeout_s` passes, or the server closes; never raises for those."""
        if self.closed or timeout_s <= 0:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        waiter = _Waiter(loop.create_future())
        self._waiters.append(waiter)
        self._ensure_watcher()
        try:
            await asyncio.wait_for(asyncio.shield(waiter.future), timeout_s)
        except TimeoutError:
            pass
        finally:
            with contextlib.suppress(ValueError):  # already taken off by a wake
                self._waiters.remove(waiter)

    def notify(self, n: int = 1) -> None:
        """Work for `n` more agents appeared in this process: wake that many waiters.
        Safe from any thread (routes run in worker threads)."""
        loop = self._loop
        if loop is None or n <= 0:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server has stopped
            loop.call_soon_threadsafe(self._wake, n)

    def close(self) -> None:
        """The server is stopping: every waiter answers now, later lease requests do not wait."""
        self._closed.set()
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self._wake, len(self._waiters) + 1_000_000)

    def _wake(self, n: int) -> None:
        while n > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.future.done():
                waiter.future.set_result(None)
                n -= 1

    def _ensure_watcher(self) -> None:
        if self._probe is None or (self._watcher is not None and not self._watcher.done()):
            return
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        """Probe while anyone waits; ends when nobody does (the next waiter restarts it)."""
        assert self._probe is not None
        probe = self._probe
        while self._waiters and not self.closed:
            await asyncio.sleep(self.recheck_s)
            if not self._waiters:
                break
            # A waiter is retried by the probe about once per cooldown_s on average.
            budget = max(1, round(len(self._waiters) * self.recheck_s / self.cooldown_s))
            try:
                queued = await run_in_threadpool(probe, budget)
                self.probes += 1
            except Exception as exc:  # a database outage: the waiters time out as usual
                log.warning("long-poll lease probe failed: %s", str(exc).splitlines()[0] if str(exc) else exc)
                continue
            if queued:
                self._wake(min(queued, budget))

    def attach_probe(self, probe: Callable[[int], int]) -> None:
        """Set the cross-process probe (once: create_app does it for its context)."""
        if self._probe is None:
            self._probe = probe


def queued_probe(sessions: sessionmaker[Session]) -> Callable[[int], int]:
    """How many tasks are queued, counted up to `limit`: one index range scan
    (ix_tasks_lease leads with state), however long the queue is."""

    def probe(limit: int) -> int:
        inner = select(Task.id).where(Task.state == TaskState.QUEUED.value).limit(limit).subquery()
        with sessions() as s:
            return int(s.scalar(select(func.count()).select_from(inner)) or 0)

    return probe


def release_on_signals(waiters: LeaseWaiters) -> None:
    """Chain SIGINT/SIGTERM so a stopping server answers its open long-polls at once.

    uvicorn waits for open requests before it stops, and a long-poll is open for up to
    its wait: without this, every stop would take that long. Called at lifespan start
    up, after uvicorn has installed its own handlers (which ours then call), in each
    worker process of `--workers N` too. Outside the main thread (a test's server in
    a thread) signals are not ours to take; `close()` is then the caller's."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous = signal.getsignal(sig)

        def handler(signum: int, frame: FrameType | None, previous: object = previous) -> None:
            waiters.close()
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(sig, handler)
