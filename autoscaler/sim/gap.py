"""Where ours spends above the reclaim-aware bound, from one run's database. Pure reads.

The bound (`autoscaler.sim.bounds`) prices each task at its own best offering, paying
only the GPUs it asks for, for its run time plus, on spot, the expected work lost to
restarts. Ours pays whole machines from launch to termination. Each machine's billed
GPU-seconds (priced at its own per-GPU rate) are split into:

- `boot`: launch until its agent registered;
- `idle_warm`: registered, nothing running or reserved on it, not draining (kept warm
  between tasks until the idle timeout);
- `idle_partial`: some GPUs busy, the rest free (a machine larger than the work on it,
  or one not yet filled);
- `idle_draining`: free GPUs after the machine was told to drain (idle timeout, budget,
  spot notice) until it was terminated;
- `gang_reserved`: GPUs a gang's rank held before all ranks were there;
- the attempts' GPU-seconds, which go to the tasks.

Per task: the attempt that finished is its useful work (`useful`), every other attempt
is work lost (reclaims, drains), except, for a task that checkpoints, what its stopped
attempts kept (the engine's own account, `TaskTrack.lost_usd`, is what it lost; the rest
of those attempts is useful: the next attempt resumed from it); the bound splits the same way into its chosen price x
run time (`useful`) and the rest of its expected cost (`expected_lost`: restarts on
spot, boots for a checkpointing task). Tasks that did not finish by the end of the run
are apart (`unfinished`): the bound pays all of them, ours what they ran.

The gap is then exactly

    boot + idle_warm + idle_partial + idle_draining + gang_reserved
    + (useful - bound useful) + (lost - bound expected_lost) + (unfinished - bound unfinished)

and the useful difference is split by the capacity type ours ran the finishing attempt
on against the bound's choice (`useful_same_type`: same type, another price, e.g. a
stormier zone's spot or another cloud; `useful_on_demand_where_bound_spot`;
`useful_spot_where_bound_on_demand`). Figures are USD, rounded to cents.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig
from autoscaler.provisioning import catalog_offerings
from autoscaler.sim.bounds import task_bound_parts
from autoscaler.sim.engine import SimSettings
from autoscaler.sim.whatif import checkpoint_every_s, checkpointing_keys
from autoscaler.sim.workload import TraceTask, Workload
from autoscaler.state.models import Instance, InstanceEvent, Task, TaskAttempt, TaskRank, Worker

MACHINE_PARTS = ("boot", "idle_warm", "idle_partial", "idle_draining", "gang_reserved")


@dataclass(frozen=True, slots=True)
class Machine:
    """One billed machine, in virtual seconds from the run's start."""

    gpus: int
    price: float  # USD/h, the whole machine
    capacity_type: str
    launched_s: float
    ready_s: float | None  # None: never registered
    end_s: float
    drain_s: float | None  # first told to drain; None: never

    @property
    def per_gpu_s(self) -> float:
        return self.price / max(self.gpus, 1) / 3600.0


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs held on a machine from `start_s` to `end_s`: an attempt or a gang reservation."""

    instance_id: str
    gpus: int
    start_s: float
    end_s: float


def machine_parts(m: Machine, attempts: list[Hold], reserved: list[Hold]) -> dict[str, float]:
    """USD of one machine's billed time that no attempt used, by cause (module docstring).
    Attempts and reservations outside the registered window are clipped to it."""
    out = dict.fromkeys(MACHINE_PARTS, 0.0)
    ready = m.end_s if m.ready_s is None else min(m.ready_s, m.end_s)
    out["boot"] = m.gpus * max(ready - m.launched_s, 0.0) * m.per_gpu_s
    # A sweep over the registered window: each stretch has a number of GPUs busy with
    # attempts, held by reservations, and a draining flag.
    edges: dict[float, list[int]] = defaultdict(lambda: [0, 0])
    for h in attempts:
        s, e = max(h.start_s, ready), min(h.end_s, m.end_s)
        if e > s:
            edges[s][0] += h.gpus
            edges[e][0] -= h.gpus
    for h in reserved:
        s, e = max(h.start_s, ready), min(h.end_s, m.end_s)
        if e > s:
            edges[s][1] += h.gpus
            edges[e][1] -= h.gpus
    points = sorted({ready, m.end_s, *edges, *([m.drain_s] if m.drain_s is not None else [])})
    busy = held = 0
    for a, b in itertools.pairwise(points):
        if a < ready or b > m.end_s:
            continue
        d_busy, d_held = edges.get(a, (0, 0))
        busy, held = busy + d_busy, held + d_held
        span = b - a
        free = max(m.gpus - busy - held, 0)
        out["gang_reserved"] += min(held, m.gpus) * span * m.per_gpu_s
        if m.drain_s is not None and a >= m.drain_s:
            out["idle_draining"] += free * span * m.per_gpu_s
        elif busy + held == 0:
            out["idle_warm"] += free * span * m.per_gpu_s
        else:
            out["idle_partial"] += free * span * m.per_gpu_s
    return out


@dataclass(frozen=True, slots=True)
class TaskSpend:
    """One trace task: ours (the finishing attempt, the others, its capacity type) and
    the bound's (useful, expected lost, choice)."""

    finished: bool
    useful: float
    lost: float
    ran_on: str | None  # capacity type of the finishing attempt's machine
    bound_useful: float
    bound_lost: float
    bound_choice: str


def task_parts(tasks: list[TaskSpend]) -> dict[str, float]:
    """The task side of the gap (module docstring)."""
    out = dict.fromkeys(
        (
            "useful_same_type",
            "useful_on_demand_where_bound_spot",
            "useful_spot_where_bound_on_demand",
            "lost_beyond_expected",
            "unfinished",
        ),
        0.0,
    )
    for t in tasks:
        if not t.finished:
            out["unfinished"] += t.useful + t.lost - t.bound_useful - t.bound_lost
            continue
        bound_type = "on_demand" if t.bound_choice == "on_demand" else "spot"
        ours_type = "spot" if t.ran_on == "spot" else "on_demand"
        if ours_type == bound_type:
            key = "useful_same_type"
        elif ours_type == "on_demand":
            key = "useful_on_demand_where_bound_spot"
        else:
            key = "useful_spot_where_bound_on_demand"
        out[key] += t.useful - t.bound_useful
        out["lost_beyond_expected"] += t.lost - t.bound_lost
    return out


def decompose(
    sessions: sessionmaker[Session],
    workload: Workload,
    config: AutoscalerConfig,
    settings: SimSettings,
    end_s: float,
    lost_usd: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The gap of a finished run, by cause, with ours and the bound it adds up to;
    `lost_usd` is the engine's work lost per task id (what checkpoints did not keep)."""
    start = settings.start
    machines, attempts, reserved, task_rows = _read(sessions, start, end_s)
    parts = dict.fromkeys(MACHINE_PARTS, 0.0)
    by_instance: dict[str, list[Hold]] = defaultdict(list)
    for per_attempt in attempts.values():
        for holds in per_attempt.values():
            for hold in holds:
                by_instance[hold.instance_id].append(hold)
    res_by_instance: dict[str, list[Hold]] = defaultdict(list)
    for hold in reserved:
        res_by_instance[hold.instance_id].append(hold)
    for iid, m in machines.items():
        for k, v in machine_parts(m, by_instance.get(iid, []), res_by_instance.get(iid, [])).items():
            parts[k] += v
    offers = [o for p in config.pools for o in catalog_offerings(p)]
    keys = checkpointing_keys(workload, settings.checkpoints_share, settings.seed)
    by_key: dict[str, TraceTask] = {t.key: t for t in workload.tasks}
    spends: list[TaskSpend] = []
    by_choice: dict[str, int] = defaultdict(int)
    ran_on_counts: dict[str, int] = defaultdict(int)
    for task_id, (key, state, last_attempt) in task_rows.items():
        trace = by_key[key]
        ckpt = checkpoint_every_s(trace.key, settings.checkpoint_every_s, keys) is not None
        _, how, b_useful, b_lost = task_bound_parts(trace, offers, settings, checkpoints=ckpt)
        useful = lost = 0.0
        ran_on: str | None = None
        for n, holds in attempts.get(task_id, {}).items():
            usd = sum(h.gpus * (h.end_s - h.start_s) * machines[h.instance_id].per_gpu_s for h in holds)
            if state == "succeeded" and n == last_attempt:
                useful += usd
                ran_on = machines[holds[0].instance_id].capacity_type
            else:
                lost += usd
        finished = state == "succeeded"
        if ckpt and finished and lost_usd is not None:
            # What the stopped attempts kept was resumed from: useful, not lost.
            truly_lost = min(max(lost_usd.get(task_id, 0.0), 0.0), lost)
            useful, lost = useful + lost - truly_lost, truly_lost
        spends.append(TaskSpend(finished, useful, lost, ran_on, b_useful, b_lost, how))
        if finished:
            by_choice[how] += 1
            ran_on_counts[f"{ran_on} where bound {how}"] += 1
    parts.update(task_parts(spends))
    ours = sum(m.price * max(m.end_s - m.launched_s, 0.0) / 3600.0 for m in machines.values())
    bound = sum(t.bound_useful + t.bound_lost for t in spends)
    return {
        "ours_usd": round(ours, 2),
        "bound_usd": round(bound, 2),
        "gap_usd": round(ours - bound, 2),
        "parts_usd": {k: round(v, 2) for k, v in parts.items()},
        "unexplained_usd": round(ours - bound - sum(parts.values()), 2),
        "bound_useful_usd": round(sum(t.bound_useful for t in spends if t.finished), 2),
        "bound_expected_lost_usd": round(sum(t.bound_lost for t in spends if t.finished), 2),
        "lost_usd": round(sum(t.lost for t in spends if t.finished), 2),
        "finished_by_bound_choice": dict(sorted(by_choice.items())),
        "finished_ran_on": dict(sorted(ran_on_counts.items())),
    }


def _utc(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


_Read = tuple[dict[str, Machine], dict[str, dict[int, list[Hold]]], list[Hold], dict[str, tuple[str, str, int]]]


def _read(sessions: sessionmaker[Session], start: datetime, end_s: float) -> _Read:
    """Machines, attempts (task -> attempt -> holds), gang reservations, and tasks
    (id -> trace key, state, last attempt) of a run."""
    end = start + timedelta(seconds=end_s)

    def s_of(dt: datetime | None) -> float:
        return (_utc(dt if dt is not None else end) - start).total_seconds()

    with sessions() as s:
        drains: dict[str, float] = {}
        rows = s.execute(
            select(InstanceEvent.instance_id, InstanceEvent.at).where(InstanceEvent.to_state == "draining")
        )
        for iid, at in rows:
            drains[iid] = min(drains.get(iid, math.inf), s_of(at))
        # Ready when its agent registered (`Instance.ready_at` is when the next cycle saw it).
        registered = dict(s.execute(select(Worker.id, Worker.registered_at)).all())
        machines: dict[str, Machine] = {}
        for i in s.scalars(select(Instance).where(Instance.launched_at.is_not(None))):
            ready = registered.get(i.worker_id) if i.worker_id else None
            ready = ready or i.ready_at
            machines[i.id] = Machine(
                i.gpus,
                i.hourly_price,
                i.capacity_type,
                s_of(i.launched_at),
                s_of(ready) if ready is not None else None,
                s_of(i.terminated_at),
                drains.get(i.id),
            )
        on_worker = {w: i for i, w in s.execute(select(Instance.id, Instance.worker_id)) if w is not None}
        reserved: list[Hold] = []
        # A gang rank's attempt opens at its reservation: the reserved stretch is the
        # reservation's (`gang_reserved`), the attempt's own time starts after it.
        reserved_until: dict[tuple[str, int, str], float] = {}
        for r in s.scalars(select(TaskRank)):
            on = on_worker.get(r.worker_id)
            if on is not None and on in machines:
                hold = Hold(on, len(r.gpu_indices or []), s_of(r.reserved_at), s_of(r.started_at or r.ended_at))
                reserved.append(hold)
                reserved_until[(r.task_id, r.attempt, on)] = hold.end_s
        attempts: dict[str, dict[int, list[Hold]]] = defaultdict(lambda: defaultdict(list))
        for a in s.scalars(select(TaskAttempt).where(TaskAttempt.instance_id.is_not(None))):
            if a.instance_id in machines:
                begin, end_at = s_of(a.started_at), s_of(a.ended_at)
                begin = min(max(begin, reserved_until.get((a.task_id, a.attempt, a.instance_id), begin)), end_at)
                attempts[a.task_id][a.attempt].append(Hold(a.instance_id, a.gpus, begin, end_at))
        tasks = {t.id: (str(t.command[-1]), t.state, t.attempts) for t in s.scalars(select(Task))}
    return machines, attempts, reserved, tasks
