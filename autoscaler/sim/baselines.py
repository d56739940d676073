"""Reference points computed on the same workload, prices, boot delays and spot
reclaim rates as our run:

- `lower_bound`: every task's GPU-seconds at the cheapest per-GPU price of any
  offering that fits it; no boot, no idle, no loss. No system can do better.
- `clearml_style`: the closest peer's open-source autoscaler as documented
  (see shared/design/anchors.md): a queue per task shape, polled every 5 min; each
  poll launches `backlog - idle - booting` workers of the queue's resource (spot first,
  on-demand when spot is not offered), one task per worker, a worker idle for 15 min is
  terminated; a preempted task is lost and resubmitted by hand 2 h later (resuming
  from its last periodic checkpoint when `checkpoint_every_s` > 0: no notice reaches it).
- `static_fleet`: on-demand machines sized to the peak of concurrent GPU demand,
  running from the first arrival to the last completion, first-fit with backfill.

A gang (a trace job wider than a machine: `nodes` ranks of `gpus` each) is one job of
nodes x gpus GPUs in every one of them: priced per GPU of a machine that fits one rank
in the bound; in the ClearML-style model it waits in its own queue (one per shape,
nodes included) until that many of the queue's workers are idle at once, holds them
all, and is lost whole when any of them is reclaimed; in the static fleet it starts
when that many machines each have a rank's GPUs free (first fit, with backfill).

These are models of other systems, not copies of our logic: they share only the
summary arithmetic (`summary.summarize`).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from autoscaler.config import AutoscalerConfig
from autoscaler.provisioning import catalog_offerings
from autoscaler.sim.engine import SimSettings, kept_s
from autoscaler.sim.summary import Span, TaskResult, summarize
from autoscaler.sim.workload import TraceTask, Workload
from providers.base import Offering

CLEARML_POLL_S = 300.0
CLEARML_IDLE_S = 900.0
CLEARML_RESUBMIT_S = 7200.0


def offerings(config: AutoscalerConfig) -> list[Offering]:
    seen: dict[tuple[str, str], Offering] = {}
    for p in config.pools:
        for o in catalog_offerings(p):
            seen.setdefault((o.instance_type, o.capacity_type), o)
    return list(seen.values())


def _work(t: TraceTask) -> float:
    return t.work_gpu_s


def lower_bound(workload: Workload, config: AutoscalerConfig) -> float:
    offers = offerings(config)
    per_gpu: dict[int, float] = {}
    total = 0.0
    for t in workload.tasks:
        if t.gpus not in per_gpu:
            fits = [o.hourly_price / o.gpus for o in offers if o.gpus >= t.gpus]
            per_gpu[t.gpus] = min(fits) if fits else math.inf
        total += t.work_gpu_s / 3600.0 * per_gpu[t.gpus]
    return round(total, 2)


def too_wide(workload: Workload, config: AutoscalerConfig) -> int:
    """How many tasks need more GPUs on one machine (a gang: per rank) than any
    instance type offers (they can never run)."""
    widest = max((o.gpus for o in offerings(config)), default=0)
    return sum(1 for t in workload.tasks if t.gpus > widest)


def _resource(offers: list[Offering], gpus: int) -> Offering:
    """The instance a user would list for a queue of `gpus`-GPU tasks: the smallest
    machine that fits, spot if offered (ClearML tries the list in order)."""
    fits = [o for o in offers if o.gpus >= gpus]
    smallest = min(o.gpus for o in fits)
    fits = [o for o in fits if o.gpus == smallest]
    return min(fits, key=lambda o: (o.capacity_type != "spot", o.hourly_price))


@dataclass
class _Worker:
    id: int
    queue: tuple[int, int]  # (GPUs, nodes): the shape its queue serves
    offering: Offering
    launched: float
    ready: float | None = None
    task: int | None = None
    idle_since: float | None = None
    end: float | None = None
    team: str = ""
    charged_until: float = 0.0
    charges: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def charge(self, until: float) -> None:
        self.charges[self.team] += self.offering.hourly_price * (until - self.charged_until) / 3600.0
        self.charged_until = until


@dataclass
class _Job:
    trace: TraceTask
    queued_at: float
    wait_s: float = 0.0
    started: bool = False
    done: bool = False
    kept_s: float = 0.0


def clearml_style(workload: Workload, config: AutoscalerConfig, settings: SimSettings) -> dict[str, Any]:
    rng = random.Random(settings.seed + 1)
    offers = offerings(config)
    jobs = [_Job(t, t.arrival_s) for t in workload.tasks]
    # A queue per task shape: GPUs per machine and, for a gang, its machines.
    shapes = sorted({(t.gpus, t.nodes) for t in workload.tasks})
    resource = {g: _resource(offers, g) for g in {g for g, _ in shapes}}
    queues: dict[tuple[int, int], deque[int]] = {sh: deque() for sh in shapes}
    workers: dict[int, _Worker] = {}
    # Workers not yet ended, in launch order (the same order as `workers`): every scan
    # walks these, not every worker ever launched, which made a long trace quadratic.
    live: list[_Worker] = []
    ids = itertools.count()
    heap: list[tuple[float, int, int, str, int]] = []  # (t, order, seq, kind, ref)
    seq = itertools.count()
    order = {"arrive": 0, "preempt": 1, "ready": 2, "finish": 3, "poll": 4}

    def push(t: float, kind: str, ref: int) -> None:
        heapq.heappush(heap, (t, order[kind], next(seq), kind, ref))

    for i, j in enumerate(jobs):
        push(j.trace.arrival_s, "arrive", i)
    first = min((t.arrival_s for t in workload.tasks), default=0.0)
    push(first, "poll", 0)
    used_gpu_s = lost_usd = 0.0
    counts = {
        "launches": 0,
        "spot_launches": 0,
        "on_demand_launches": 0,
        "fallbacks": 0,
        "preemptions": 0,
        "lost_tasks_resubmitted": 0,
    }
    pending_jobs = len(jobs)
    now = 0.0
    # The workers a running job holds (one for a single task, `nodes` for a gang),
    # the first of them carrying its finish event.
    holding: dict[int, list[_Worker]] = {}

    def idle(w: _Worker) -> bool:
        return w.task is None and w.ready is not None and w.end is None

    def take(w: _Worker) -> None:
        q = queues[w.queue]
        if not q or not idle(w):
            return
        nodes = w.queue[1]
        group = [w]
        if nodes > 1:
            # A gang needs all its machines at once: the queue's idle workers, w first.
            group += [o for o in live if o is not w and o.queue == w.queue and idle(o)][: nodes - 1]
            if len(group) < nodes:
                return
        ji = q.popleft()
        job = jobs[ji]
        job.wait_s += now - job.queued_at
        job.started = True
        for m in group:
            m.charge(now)
            m.team, m.task, m.idle_since = job.trace.team, ji, None
            w_start[m.id] = now
        holding[ji] = group
        push(now + max(job.trace.duration_s - job.kept_s, 0.0), "finish", w.id)

    def release(ji: int) -> list[_Worker]:
        """The job's workers, freed (idle from now); GPU-seconds they ran counted."""
        nonlocal used_gpu_s
        group = holding.pop(ji, [])
        for m in group:
            used_gpu_s += jobs[ji].trace.gpus * (now - w_start[m.id])
            m.task, m.idle_since = None, now
        return group

    w_start: dict[int, float] = {}
    # The same stop as ours (`SimSettings.horizon_after_last_arrival_s`): a task longer
    # than the typical time between reclaims is lost and resubmitted by hand forever,
    # so without it the baseline never ends; what is left counts as unfinished.
    stop_at = max((j.trace.arrival_s for j in jobs), default=0.0) + settings.horizon_after_last_arrival_s
    while heap:
        if heap[0][0] > stop_at:
            break
        now, _, _, kind, ref = heapq.heappop(heap)
        if kind == "arrive":
            job = jobs[ref]
            job.queued_at = now
            shape = (job.trace.gpus, job.trace.nodes)
            queues[shape].append(ref)
            for w in live:  # `take` skips ended ones still listed
                if w.queue == shape and w.task is None:
                    take(w)
        elif kind == "ready":
            w = workers[ref]
            if w.end is None:
                w.ready, w.idle_since = now, now
                take(w)
        elif kind == "finish":
            w = workers[ref]
            if w.end is not None or w.task is None or holding.get(w.task, [None])[0] is not w:
                continue
            job = jobs[w.task]
            job.done = True
            pending_jobs -= 1
            for m in release(w.task):
                take(m)
        elif kind == "preempt":
            w = workers[ref]
            if w.end is not None:
                continue
            counts["preemptions"] += 1
            w.charge(now)
            w.end = now
            if w.task is not None:
                ji = w.task
                job = jobs[ji]
                ran = now - w_start[w.id]
                # No notice reaches the task (no drain on a spot notice): only periodic
                # checkpoints survive. A gang is lost on every one of its machines.
                kept = kept_s(ran, settings.checkpoint_every_s, told_to_stop=False)
                job.kept_s += kept
                group = release(ji)
                for m in group:
                    lost_usd += job.trace.gpus * (ran - kept) / 3600.0 * m.offering.hourly_price / m.offering.gpus
                # Lost: resubmitted by hand 2 h later; those 2 h are waiting too.
                counts["lost_tasks_resubmitted"] += 1
                push(now + CLEARML_RESUBMIT_S, "arrive", ji)
                job.wait_s += CLEARML_RESUBMIT_S
                for m in group:
                    if m is not w:
                        take(m)
        elif kind == "poll":
            live[:] = [w for w in live if w.end is None]
            for w in live:
                if (
                    w.end is None
                    and w.task is None
                    and w.idle_since is not None
                    and now - w.idle_since >= CLEARML_IDLE_S
                ):
                    w.charge(now)
                    w.end = now
            for shape, q in queues.items():
                g, nodes = shape
                n_idle = sum(1 for w in live if w.queue == shape and idle(w))
                booting = sum(1 for w in live if w.queue == shape and w.end is None and w.ready is None)
                # The backlog in machines: a gang asks for all of its own.
                for _ in range(max(len(q) * nodes - n_idle - booting, 0)):
                    o = resource[g]
                    w = _Worker(next(ids), shape, o, now, team=jobs[q[0]].trace.team, charged_until=now)
                    workers[w.id] = w
                    live.append(w)
                    counts["launches"] += 1
                    counts["spot_launches" if o.capacity_type == "spot" else "on_demand_launches"] += 1
                    lo, hi = settings.boot_delay_s
                    push(now + rng.uniform(lo, hi), "ready", w.id)
                    rate = settings.preemption_by_zone.get(o.zone or "", settings.preemption_per_hour)
                    if o.capacity_type == "spot" and rate > 0:
                        push(now + rng.expovariate(rate) * 3600.0, "preempt", w.id)
            alive = any(w.end is None for w in live)
            if pending_jobs > 0 or alive:
                push(now + CLEARML_POLL_S, "poll", 0)
    spans: list[Span] = []
    team_costs: dict[str, float] = defaultdict(float)
    for w in workers.values():
        end = w.end if w.end is not None else now
        if w.end is None:
            w.charge(end)
        for team, usd in w.charges.items():
            team_costs[team] += usd
        spans.append(Span(w.team, w.offering.gpus, w.offering.hourly_price, w.launched, end, w.ready))
    results = [TaskResult(j.trace.team, j.wait_s, j.done, j.started, _work(j.trace)) for j in jobs]
    return summarize(
        results, spans, used_gpu_s=used_gpu_s, lost_usd=lost_usd, counts=counts, team_costs=dict(team_costs)
    )


def peak_gpus(workload: Workload) -> int:
    """Most GPUs asked for at once if every task started on arrival (a gang: all of its)."""
    events = sorted(
        [(t.arrival_s, t.total_gpus) for t in workload.tasks]
        + [(t.arrival_s + t.duration_s, -t.total_gpus) for t in workload.tasks],
        key=lambda e: (e[0], e[1]),
    )
    cur = peak = 0
    for _, d in events:
        cur += d
        peak = max(peak, cur)
    return peak


def static_fleet(workload: Workload, config: AutoscalerConfig) -> dict[str, Any]:
    offers = [o for o in offerings(config) if o.capacity_type == "on_demand"]
    node = min(offers, key=lambda o: (-o.gpus, o.hourly_price / o.gpus))
    # Enough machines for the peak, and for the widest gang to run at all.
    widest = max((t.nodes for t in workload.tasks), default=1)
    n_nodes = max(math.ceil(peak_gpus(workload) / node.gpus), widest, 1)
    free = [node.gpus] * n_nodes
    heap: list[tuple[float, int, int, int]] = []  # (finish time, seq, node, task index)
    seq = itertools.count()
    tasks = list(workload.tasks)
    waiting: list[int] = []
    results: list[TaskResult | None] = [None] * len(tasks)
    gpu_s_by_team: dict[str, float] = defaultdict(float)
    i = 0
    now = 0.0

    def schedule() -> None:
        still: list[int] = []
        for ti in waiting:
            t = tasks[ti]
            # First fit: the first machine(s) with a rank's GPUs free; a gang needs
            # `nodes` of them at once, one rank on each.
            fit = list(itertools.islice((k for k in range(n_nodes) if free[k] >= t.gpus), t.nodes))
            if len(fit) < t.nodes:
                still.append(ti)
                continue
            for n in fit:
                free[n] -= t.gpus
                heapq.heappush(heap, (now + t.duration_s, next(seq), n, ti))
            results[ti] = TaskResult(t.team, now - t.arrival_s, True, True, _work(t))
            gpu_s_by_team[t.team] += t.work_gpu_s
        waiting[:] = still

    while i < len(tasks) or heap:
        t_arr = tasks[i].arrival_s if i < len(tasks) else math.inf
        t_fin = heap[0][0] if heap else math.inf
        now = min(t_arr, t_fin)
        while heap and heap[0][0] <= now:
            _, _, n, ti = heapq.heappop(heap)
            free[n] += tasks[ti].gpus
        while i < len(tasks) and tasks[i].arrival_s <= now:
            waiting.append(i)
            i += 1
        schedule()
    start = min((t.arrival_s for t in tasks), default=0.0)
    spans = [Span("shared", node.gpus, node.hourly_price, start, now, start) for _ in range(n_nodes)]
    total_cost = sum(s.cost for s in spans)
    used = sum(gpu_s_by_team.values()) or 1.0
    team_costs = {team: total_cost * g / used for team, g in gpu_s_by_team.items()}
    final = [r for r in results if r is not None]
    report = summarize(
        final,
        spans,
        used_gpu_s=sum(gpu_s_by_team.values()),
        lost_usd=0.0,
        counts={
            "launches": n_nodes,
            "spot_launches": 0,
            "on_demand_launches": n_nodes,
            "fallbacks": 0,
            "preemptions": 0,
        },
        team_costs=team_costs,
    )
    report["fleet"] = {"instance_type": node.instance_type, "instances": n_nodes, "peak_gpus": peak_gpus(workload)}
    return report
