"""The agent's main loop: register, then heartbeat, lease, run, watch and report
until a drain, a spot notice or the server ends the worker's life.

One thread does everything that decides (this loop); tasks are subprocesses in
their own process groups and only their output is read by helper threads. The
server being away never stops running tasks: calls are retried with backoff and
reports wait in the outbox. SIGTERM (or SIGINT) starts a drain with the configured
deadline; a second one moves the deadline to now.

Exit codes: 0 drained or preempted and deregistered (the image may power off);
2 the server declared this worker gone (the service manager should restart the
agent, which re-registers with its saved worker token); 1 a one-line error (bad
bootstrap, refused join).
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import signal
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from types import FrameType

from autoscaler import __version__
from autoscaler.agent import credentials, host
from autoscaler.agent.container import ContainerSettings, detect_engine, remove_leftovers
from autoscaler.agent.decisions import (
    StopRequest,
    backoff_s,
    finish_report,
    preempt_grace_s,
    preempt_margin_s,
    start_failed_report,
)
from autoscaler.agent.errors import AgentError
from autoscaler.agent.gpus import GpuSource
from autoscaler.agent.join_secret import fetch_join_token
from autoscaler.agent.metadata import MetadataService, Notice
from autoscaler.agent.outbox import Outbox
from autoscaler.agent.runner import StartFailed, TaskProcess
from autoscaler.agent.server_api import ServerApi, ServerRefused, ServerUnreachable
from autoscaler.agent.settings import AgentSettings, task_base_env
from autoscaler.agent.task_user import TaskUserError, decide
from autoscaler.agent.wire import Commands, HeartbeatBody, RegisterBody, Registered

log = logging.getLogger("autoscaler.agent")
JOIN_TOKEN_REFUSED = (
    "the join token is invalid or expired (one lasts 1 h unless made with --ttl): create one with "
    "`autoscaler token create --join --pool POOL` and give it as AUTOSCALER_JOIN_TOKEN"
)
TICK_S = 0.05
# An idle agent's lease polls are most of the server's load: after each empty lease
# the next poll waits twice as long, up to this many lease intervals (2 s -> 4 s ->
# 5 s by default), so new work waits at most ~5 s for an idle agent.
IDLE_LEASE_BACKOFF_MAX = 2.5
LONG_POLL_MIN_S = 0.5  # a shorter long-poll is not worth holding the loop for
# How often an agent holding a rank of a forming gang asks for its start.
GANG_LEASE_S = 0.25
EXIT_DONE, EXIT_ERROR, EXIT_GONE = 0, 1, 2
MIN_FLUSH_S = 2.0  # after a SIGTERM, the least time left to deliver reports and deregister


class RegistrationRefused(AgentError):
    """The server answered 4xx to a registration."""


class Mode(StrEnum):
    RUNNING = "running"  # leasing and running tasks
    DRAINING = "draining"  # no new tasks; running ones may finish until the deadline
    PREEMPTED = "preempted"  # spot notice: tasks were told to checkpoint and stop
    GONE = "gone"  # the server gave up on this worker: stop everything, exit 2


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        api: ServerApi,
        gpus: GpuSource,
        metadata: MetadataService | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
        max_tasks: int | None = None,
    ) -> None:
        self.s = settings
        self.t = settings.timing
        self.api = api
        self.gpus = gpus
        self.metadata = metadata
        self.clock = clock
        self.sleep = sleep
        self.wall = wall  # UTC wall time: notices' and the server's deadlines are dates
        self.mode = Mode.RUNNING
        self.tasks: dict[str, TaskProcess] = {}
        self.outbox = Outbox()
        self.inventory = gpus.inventory()
        self.max_tasks = max_tasks or max(1, len(self.inventory))
        self.work_root = settings.work_dir or Path(tempfile.gettempdir()) / "autoscaler-agent"
        self.base_env = task_base_env()
        self.task_users = decide(settings.run_as, settings.run_as_range, settings.allow_root_tasks)
        self.containers = ContainerSettings(
            pull_timeout_s=self.t.image_pull_timeout_s,
            # Simulated GPUs have no device node to hand to a container.
            gpu_devices=not any(g.simulated for g in self.inventory),
        )
        self.state_dir = settings.state_dir or credentials.default_state_dir(os.environ, os.geteuid())
        self.drain_deadline: float | None = None
        self.signals = 0
        self.signals_seen = 0
        self.failures = 0
        self.unreachable_since: float | None = None
        self.retry_at = 0.0
        self.next_heartbeat = 0.0
        self.next_lease = 0.0
        self.empty_leases = 0  # consecutive empty lease polls, for the idle back-off
        self.next_notice = 0.0
        self.next_flush = 0.0
        self.heartbeat_s = 10.0
        self.heartbeat_in_lease = False  # the server records a heartbeat carried by a lease
        self.stopped_at: float | None = None  # when a drain/preemption had nothing left to run
        self.exit_by: float | None = None  # after a SIGTERM: gone by then, server or not
        self.notice: Notice | None = None  # the spot notice, once there is one

    # -- lifecycle ---------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for note in self.task_users.notes:
            log.warning("%s", note)
        self._prepare_work_root()
        self._remove_leftover_containers()
        reg = self._register()
        if reg is None:
            return EXIT_DONE
        self.heartbeat_s = self.t.heartbeat_s or reg.heartbeat_interval_s
        self.heartbeat_in_lease = reg.heartbeat_in_lease
        self.outbox.finish_with_logs = reg.finish_with_logs
        log.info(
            "registered as worker %s (pool %s, %d GPUs: %s); heartbeat every %.1fs; %s",
            reg.worker_id,
            self.s.pool,
            len(self.inventory),
            self.gpus.description,
            self.heartbeat_s,
            self.task_users.describe(),
        )
        try:
            while True:
                code = self._tick(self.clock())
                if code is not None:
                    return code
                self.sleep(TICK_S)
        finally:
            self.api.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only count here: the loop acts on it, outside the signal handler.
        self.signals += 1

    def _prepare_work_root(self) -> None:
        """The parent of the tasks' scratch dirs: the agent's own; 0711 when tasks run as
        another user (they may pass through to their own dir but not list the others)."""
        root = self.work_root
        try:
            root.mkdir(parents=True, exist_ok=True)
            st = root.lstat()
        except OSError as exc:
            raise AgentError(f"cannot create the work dir {root}: {exc.strerror or exc}") from None
        if not root.is_dir() or root.is_symlink() or st.st_uid != os.geteuid():
            raise AgentError(
                f"work dir {root} is not a directory owned by the agent (uid {os.geteuid()}); pass --work-dir"
            )
        base = self.task_users.base
        if base is not None and base.switch:
            root.chmod(0o711)

    def _remove_leftover_containers(self) -> None:
        engine = detect_engine()
        if engine is None:
            return
        gone = remove_leftovers(engine, self.work_root, self.base_env)
        if gone:
            log.warning("removed %d container(s) an earlier agent left running: %s", len(gone), ", ".join(gone))

    def _register(self) -> Registered | None:
        instance_id = self.s.instance_id
        if not instance_id:
            instance_id = self.metadata.instance_id() if self.metadata else host.hostname()
        body = RegisterBody(
            hostname=host.hostname(),
            instance_id=instance_id,
            provider=self.s.provider,
            pool=self.s.pool,
            gpus=self.inventory,
            cpus=host.cpu_count(),
            memory_mb=host.memory_mb(),
            agent_version=__version__,
            identity=self.metadata.identity() if self.metadata else None,
            address=host.private_address(self.s.provider),
        )
        saved = credentials.load_worker(self.state_dir)
        if saved is not None and not saved.matches(self.s.server_url, self.s.pool, instance_id):
            log.warning("saved worker state is for another server, pool or instance; not using it")
            saved = None
        reply: Registered | None = None
        if saved is not None:
            # A restart: the join token registered once and is spent (and was removed
            # from the bootstrap file); the worker token re-registers this machine (and
            # is rotated).
            try:
                reply = self._call_register(saved.worker_token, body)
            except RegistrationRefused as exc:
                log.warning("%s; registering with the join token instead", exc)
                credentials.forget_worker(self.state_dir)
            if reply is None and self.signals:
                return None
            if reply is not None:
                log.info("re-registered with the saved worker token (was worker %s)", saved.worker_id)
        if reply is None:
            join = self.s.join_token or (fetch_join_token(self.s.join_token_ref) if self.s.join_token_ref else None)
            if not join:
                if saved is not None:
                    raise AgentError(
                        f"the server refused this machine's saved worker token (worker {saved.worker_id}) and the "
                        "join token was used up at the first registration; the machine cannot join again (its "
                        "instance is replaced by the control plane)"
                    )
                raise AgentError("no join token (see docs/agent.md, 'Bootstrap')")
            # Lets this process, and only it, retry a join whose answer was lost.
            body = body.model_copy(update={"retry_key": secrets.token_hex(16)})
            reply = self._call_register(join, body)
        return self._joined(reply, instance_id)

    def _joined(self, reg: Registered | None, instance_id: str) -> Registered | None:
        """After a registration: keep the worker token (0600, state dir), drop the join token."""
        if reg is None:
            return None
        try:
            path = credentials.save_worker(
                self.state_dir,
                credentials.WorkerState(
                    server_url=self.s.server_url,
                    pool=self.s.pool,
                    instance_id=instance_id,
                    worker_id=reg.worker_id,
                    worker_token=reg.worker_token,
                ),
            )
            log.info("worker token kept in %s (mode 0600)", path)
        except OSError as exc:
            log.warning("cannot save the worker token in %s (%s): a restarted agent cannot rejoin", self.state_dir, exc)
        boot = self.s.bootstrap_path
        if boot is not None:
            try:
                if credentials.drop_join_token(boot):
                    log.info("removed the join token from %s", boot)
            except (OSError, ValueError) as exc:
                log.warning(
                    "cannot remove the join token from %s (%s): whoever can read that file can read it",
                    boot,
                    getattr(exc, "strerror", None) or exc,
                )
        return reg

    def _call_register(self, token: str, body: RegisterBody) -> Registered | None:
        first = self.clock()
        failures = 0
        while True:
            if self.signals:
                log.info("stopped before registering")
                return None
            try:
                return self.api.register(token, body)
            except ServerRefused as exc:
                # The server's 401 speaks to CLI users (AUTOSCALER_TOKEN); an agent's token is a join token.
                detail = JOIN_TOKEN_REFUSED if exc.status == 401 else exc.detail
                raise RegistrationRefused(f"the server at {self.s.server_url} refused registration: {detail}") from None
            except ServerUnreachable as exc:
                failures += 1
                if self.clock() - first > self.t.register_timeout_s:
                    raise AgentError(
                        f"cannot reach the server at {self.s.server_url} for "
                        f"{self.t.register_timeout_s:.0f}s ({exc}); check server_url and the network"
                    ) from None
                delay = backoff_s(failures, base_s=0.5, cap_s=self.t.backoff_max_s, jitter=random.random())
                log.warning("server not reachable yet (%s); retrying in %.1fs", exc, delay)
                self._sleep_unless_signaled(delay)

    def _sleep_unless_signaled(self, delay: float) -> None:
        """Sleep in short steps so a SIGTERM ends a back-off at once, not after it."""
        step = max(TICK_S, 0.2)
        while delay > 0 and not self.signals:
            self.sleep(min(step, delay))
            delay -= step

    # -- one pass of the loop ------------------------------------------------------
    def _tick(self, now: float) -> int | None:
        self._handle_signals(now)
        self._watch_tasks(now)
        self._watch_notice(now)
        self._enforce_drain_deadline(now)
        if now >= self.retry_at:
            try:
                self._talk(now)
                self._reachable(now)
            except ServerUnreachable as exc:
                self._unreachable(now, exc)
        return self._exit_code(now)

    def _handle_signals(self, now: float) -> None:
        if self.signals == self.signals_seen:
            return
        first = self.signals_seen == 0
        self.signals_seen = self.signals
        if first:
            self.exit_by = now + self.t.drain_deadline_s + self.t.kill_grace_s
        if first and self.mode == Mode.RUNNING:
            log.info("SIGTERM: draining, running tasks may go on for %.0fs", self.t.drain_deadline_s)
            self._begin_drain(now, now + self.t.drain_deadline_s)
            if self.signals_seen >= 2:  # two signals before the loop saw the first
                self.drain_deadline = now
        elif first and self.mode == Mode.DRAINING and self.drain_deadline is not None:
            # Already draining for the server: the stop of the service must not wait longer.
            self.drain_deadline = min(self.drain_deadline, now + self.t.drain_deadline_s)
        elif not first and self.mode == Mode.DRAINING:
            log.info("second signal: interrupting running tasks now")
            self.drain_deadline = now

    def _begin_drain(self, now: float, deadline: float) -> None:
        self.mode = Mode.DRAINING
        self.drain_deadline = deadline
        self.next_heartbeat = now  # tell the server at once

    def _begin_preemption(self, now: float, notice: Notice) -> None:
        left = (notice.deadline - self.wall()).total_seconds() if notice.deadline is not None else None
        margin = preempt_margin_s(self.s.provider, self.t.preempt_margin_s)
        grace = preempt_grace_s(left, margin_s=margin, fallback_s=self.t.preempt_grace_s)
        if left is None:
            why = "the notice gives no time"
        elif left <= 0:
            why = f"its deadline passed {-left:.0f}s ago by this clock"
        else:
            why = f"deadline in {left:.0f}s, {margin:g}s kept to report"
        log.warning(
            "preemption notice: %s; stopping %d task(s) so they can checkpoint (SIGKILL after %.0fs: %s)",
            notice.reason,
            len(self.tasks),
            grace,
            why,
        )
        self.mode = Mode.PREEMPTED
        self.notice = notice
        for tp in self.tasks.values():
            tp.request_stop(StopRequest("spot", notice.reason), now, grace)
        self.next_heartbeat = now

    def _watch_tasks(self, now: float) -> None:
        for tp in list(self.tasks.values()):
            if tp.stop is None and tp.timed_out(now):
                log.info("task %s: timeout after %.1fs, stopping it", tp.task_id, tp.task.timeout_s or 0)
                tp.request_stop(StopRequest("timeout", f"timeout after {tp.task.timeout_s}s"), now, self.t.kill_grace_s)
            code = tp.poll(now)
            if code is None:
                continue
            tp.reap()
            del self.tasks[tp.task_id]
            if tp.stop is not None and tp.stop.cause == "abandoned":
                continue  # the server already requeued it: nothing to report
            self.outbox.output(tp.task_id, tp.output.take())
            if tp.failure is not None:  # its code, setup or image did not come: the command never ran
                log.warning("task %s: %s", tp.task_id, tp.failure)
                self.outbox.finished(tp.task_id, start_failed_report(tp.failure))
            else:
                self.outbox.finished(tp.task_id, finish_report(tp.stop, code))
        if now >= self.next_flush:
            self.next_flush = now + self.t.log_flush_s
            if self.failures == 0:  # while the server is away, output waits in the capped buffers
                for tp in self.tasks.values():
                    chunks = tp.output.take()
                    if chunks:
                        self.outbox.output(tp.task_id, chunks)

    def _watch_notice(self, now: float) -> None:
        if self.metadata is None or self.mode in (Mode.PREEMPTED, Mode.GONE) or now < self.next_notice:
            return
        self.next_notice = now + self.t.notice_poll_s
        try:
            notice = self.metadata.preemption_notice()
        except Exception as exc:  # any failure of the metadata service: log, poll again later
            log.warning("cannot read the %s preemption notice: %s", self.metadata.provider, exc)
            return
        if notice:
            self._begin_preemption(now, notice)

    def _enforce_drain_deadline(self, now: float) -> None:
        if self.mode != Mode.DRAINING or self.drain_deadline is None or now < self.drain_deadline:
            return
        for tp in self.tasks.values():
            if tp.stop is None:
                log.info("task %s: drain deadline reached, interrupting it", tp.task_id)
            tp.request_stop(StopRequest("drain", "drain deadline"), now, self.t.kill_grace_s)

    # -- talking to the server -------------------------------------------------------
    def _talk(self, now: float) -> None:
        if self.mode == Mode.GONE:
            return
        if now >= self.next_heartbeat and not self._heartbeat_rides_lease(now):
            self._heartbeat(now)
        self.outbox.deliver(self.api)
        if self.mode == Mode.RUNNING and now >= self.next_lease:
            self._lease(now)

    def _heartbeat_rides_lease(self, now: float) -> bool:
        """Will the lease this tick sends carry the heartbeat? Only an idle agent's: one
        that runs nothing, has nothing to report and leases now. Its heartbeat says
        nothing a lease could not carry (no task runs, no drain, no notice), so the
        (long-poll) lease is the interval's heartbeat and an idle agent makes one
        request per interval instead of two (the server records it exactly as
        POST /heartbeat would, and marks the worker lost as before if it stops)."""
        return (
            self.heartbeat_in_lease
            and self.mode == Mode.RUNNING
            and now >= self.next_lease
            and not self.tasks
            and not len(self.outbox)
            and self.signals == self.signals_seen
            and not getattr(self.api, "gang_reserved", False)
            and self._free_gpus() != 0
        )

    def _heartbeat_body(self) -> HeartbeatBody:
        return HeartbeatBody(
            gpu_metrics=self.gpus.sample(),
            running=sorted(self.tasks),
            draining=self.mode != Mode.RUNNING,
            preempted=self.mode == Mode.PREEMPTED,
            preempt_reason=self.notice.reason[:255] if self.notice else "",
            preempt_deadline=self.notice.deadline if self.notice else None,
        )

    def _heartbeat(self, now: float) -> None:
        body = self._heartbeat_body()
        try:
            commands = self.api.heartbeat(body)
        except ServerRefused as exc:
            if exc.status in (401, 403, 404):
                self._gone(now, f"the server no longer knows this worker ({exc})")
                return
            raise ServerUnreachable(str(exc)) from None
        self.next_heartbeat = now + self.heartbeat_s
        self._obey(now, commands)

    def _obey(self, now: float, commands: Commands) -> None:
        if commands.shutdown:
            self._gone(now, "the server declared this worker gone (missed heartbeats?)")
            return
        for task_id in commands.cancel:
            tp = self.tasks.get(task_id)
            if tp is not None and tp.stop is None:
                log.info("task %s: canceled by the server", task_id)
                tp.request_stop(StopRequest("canceled", "canceled by the server"), now, self.t.kill_grace_s)
        for task_id in commands.reclaim:
            tp = self.tasks.get(task_id)
            if tp is not None and tp.stop is None:
                log.info("task %s: its borrowed quota is reclaimed; stopping it so it can checkpoint", task_id)
                tp.request_stop(StopRequest("reclaim", "quota reclaimed"), now, self.t.preempt_grace_s)
        if commands.drain and self.mode == Mode.RUNNING:
            if commands.drain_deadline is not None:
                left = (commands.drain_deadline - self.wall()).total_seconds()
            else:
                left = self.t.drain_deadline_s
            log.info("drain requested by the server; running tasks may go on for %.0fs", max(left, 0))
            self._begin_drain(now, now + max(left, 0.0))
        elif commands.drain and self.mode == Mode.DRAINING and commands.drain_deadline is not None:
            # The server may bring a drain's deadline forward (a rebalance recommendation
            # followed by the interruption notice itself); it never pushes it back.
            left = max((commands.drain_deadline - self.wall()).total_seconds(), 0.0)
            if self.drain_deadline is not None and now + left < self.drain_deadline - 1.0:
                log.info("the server moved the drain deadline forward: running tasks may go on for %.0fs", left)
                self.drain_deadline = now + left

    def _gone(self, now: float, why: str) -> None:
        if self.mode == Mode.GONE:
            return
        log.error("%s; stopping %d task(s) and exiting", why, len(self.tasks))
        self.mode = Mode.GONE
        for tp in self.tasks.values():
            tp.request_stop(StopRequest("abandoned", why), now, self.t.kill_grace_s)

    def _free_gpus(self) -> int | None:
        """GPUs no running task holds; None on a CPU-only agent (the task count limits it)."""
        if not self.inventory:
            return None
        held = sum(len(tp.task.gpu_indices or []) for tp in self.tasks.values())
        return len(self.inventory) - held

    def _long_poll_s(self, now: float) -> float:
        """How long this lease may wait in the server: only while nothing runs and no
        report waits (the loop watches nothing else meanwhile), never past the next
        heartbeat or preemption check, and not for a moment too short to be worth it."""
        if self.tasks or len(self.outbox) or self.signals != self.signals_seen:
            return 0.0
        if getattr(self.api, "gang_reserved", False):
            return 0.0  # a rank of a forming gang asks for its start every GANG_LEASE_S
        until = min(self.t.lease_wait_s, self.next_heartbeat - now)
        if self.metadata is not None:
            until = min(until, self.next_notice - now)
        return until if until >= LONG_POLL_MIN_S else 0.0

    def _lease(self, now: float) -> None:
        got = False
        waited = False  # the server held an empty long-poll: ask again without back-off
        while self.mode == Mode.RUNNING and len(self.tasks) < self.max_tasks:
            if self._free_gpus() == 0:
                # Every GPU is taken: do not poll. (A CPU-only task, gpus: 0, then waits
                # for an agent with a free GPU or a CPU-only agent.)
                break
            beat, due = None, self.next_heartbeat
            if not got and now >= self.next_heartbeat and self._heartbeat_rides_lease(now):
                # The lease is this interval's heartbeat: its wait runs to the next one.
                beat, self.next_heartbeat = self._heartbeat_body(), now + self.heartbeat_s
            wait = 0.0 if got else self._long_poll_s(now)
            asked = self.clock()
            try:
                if beat is not None:
                    task = self.api.lease(wait, heartbeat=beat)
                else:
                    task = self.api.lease(wait) if wait > 0 else self.api.lease()
            except ServerRefused as exc:
                self.next_heartbeat = due if beat is not None else self.next_heartbeat
                if exc.status in (401, 403, 404):
                    self._gone(now, f"the server no longer knows this worker ({exc})")
                else:
                    log.warning("lease refused (%s); trying again in %.1fs", exc, self.t.lease_s)
                break
            except ServerUnreachable:
                self.next_heartbeat = due if beat is not None else self.next_heartbeat  # not delivered
                raise
            if wait > 0:
                now = self.clock()  # the wait may have been long: start times must be true
            if beat is not None:
                commands = getattr(self.api, "lease_commands", None)
                if commands is None:
                    # The server did not record it: heartbeat on its own from now on.
                    self.heartbeat_in_lease, self.next_heartbeat = False, due
                else:
                    self._obey(now, commands)
                    if self.mode != Mode.RUNNING:
                        break  # drained or gone: the server gave no task with that
            if task is None:
                # A server without long-poll answers at once: then back off as before.
                waited = wait > 0 and now - asked >= wait / 2
                break
            got = True
            log.info(
                "task %s: leased (attempt %d, GPUs %s): %s",
                task.id,
                task.attempts,
                task.gpu_indices,
                " ".join(task.command)[:200] + (f" (in image {task.image})" if task.image else ""),
            )
            try:
                user = self.task_users.allocate(
                    [tp.user.uid for tp in self.tasks.values() if tp.user is not None and tp.user.dedicated]
                )
            except TaskUserError as exc:
                log.error("task %s: not started: %s", task.id, exc)
                self.outbox.finished(task.id, start_failed_report(str(exc)))
                continue
            try:
                tp = TaskProcess.start(
                    task, self.base_env, self.work_root, now, user, self.s.server_url, self.containers
                )
            except StartFailed as exc:
                log.warning("task %s: %s", task.id, exc)
                self.outbox.finished(task.id, start_failed_report(str(exc)))
                continue
            self.tasks[task.id] = tp
            self.outbox.started(task.id)
        if waited:
            self.empty_leases = 0
            self.next_lease = now  # the wait was the interval: ask again after the heartbeat
        else:
            self.empty_leases = 0 if got else min(self.empty_leases + 1, 8)
            self.next_lease = now + self.t.lease_s * min(2 ** max(self.empty_leases - 1, 0), IDLE_LEASE_BACKOFF_MAX)
        if getattr(self.api, "gang_reserved", False):
            # This machine holds a rank of a gang still forming: its start comes on a
            # lease, and all ranks should start together, so ask again soon.
            self.empty_leases = 0
            self.next_lease = now + min(self.t.lease_s, GANG_LEASE_S)
        self.outbox.deliver(self.api)

    def _reachable(self, now: float) -> None:
        if self.failures:
            away = now - (self.unreachable_since or now)
            log.warning("server reachable again after %.1fs; %d task(s) kept running", away, len(self.tasks))
        self.failures = 0
        self.unreachable_since = None

    def _unreachable(self, now: float, exc: ServerUnreachable) -> None:
        self.failures += 1
        if self.unreachable_since is None:
            self.unreachable_since = now
            log.warning("server unreachable (%s); tasks keep running, retrying with backoff", exc)
        delay = backoff_s(
            self.failures,
            base_s=min(1.0, self.heartbeat_s),
            cap_s=self.t.backoff_max_s,
            jitter=random.random(),
        )
        self.retry_at = now + delay

    # -- leaving ---------------------------------------------------------------------
    def _flush_deadline(self) -> float:
        """Until when a stopped agent keeps trying to deliver reports and deregister.

        Without a signal: `exit_flush_timeout_s` after the last task ended. After a
        SIGTERM the agent must be gone by the drain deadline plus the kill grace (what
        a service manager's stop timeout is sized for), however many calls are failing
        or backing off; it still gets MIN_FLUSH_S to say goodbye. After a second
        signal it leaves at once.
        """
        assert self.stopped_at is not None
        normal = self.stopped_at + self.t.exit_flush_timeout_s
        if self.signals_seen >= 2:
            return self.stopped_at
        if self.exit_by is not None:
            return min(normal, max(self.exit_by, self.stopped_at + MIN_FLUSH_S))
        return normal

    def _exit_code(self, now: float) -> int | None:
        if self.mode == Mode.RUNNING or self.tasks:
            return None
        if self.stopped_at is None:
            self.stopped_at = now
        in_window = now < self._flush_deadline()
        if len(self.outbox) and in_window:
            return None  # reports still waiting for the server
        if now < self.retry_at and in_window:
            return None  # backing off from a failed call; once the window is over, leave anyway
        if len(self.outbox):
            log.error(
                "giving up on %d undelivered report(s); the server will notice the missing heartbeats",
                len(self.outbox),
            )
        if self.mode == Mode.GONE:
            # Not deregistering: that would revoke the worker token, which is how the
            # restarted agent comes back (the join token registered once and is spent).
            return EXIT_GONE
        try:
            self.api.deregister()
            log.info("deregistered")
        except (ServerUnreachable, ServerRefused) as exc:
            if self.clock() < self._flush_deadline():
                self.retry_at = now + 1.0
                return None
            log.warning("could not deregister (%s)", exc)
        credentials.forget_worker(self.state_dir)  # drained: nothing to come back to
        log.info("%s finished; exiting 0", "preemption" if self.mode == Mode.PREEMPTED else "drain")
        return EXIT_DONE
