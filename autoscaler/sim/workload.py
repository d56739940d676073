"""What a simulation replays: trace tasks (arrival, run time, GPUs, team), and the
`KIND:PATH` spec that names a loader.

Every loader returns the same `Workload`; the simulator and the baselines never look
at trace formats. A bad spec or an unreadable file is an `InvalidInput` whose message
names the path and what the KIND expects (the CLI prints it as one line).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from autoscaler.errors import InvalidInput

# GPUs of the widest machine a trace job would run on: the default catalog's first pool
# (AWS p3.16xlarge, 8 V100). A job asking for more becomes ONE gang task of
# ceil(gpus / 8) ranks (`gang_of`): all ranks start together, on one machine each.
MACHINE_GPUS = 8


@dataclass(frozen=True)
class TraceTask:
    """One unit of work: enqueued at `arrival_s` (seconds from the trace start), runs for
    `duration_s` once it starts, on `gpus` GPUs of each of `nodes` machines (a gang when
    `nodes` > 1, enqueued with `nodes=N` as a user's multi-node task is)."""

    key: str
    team: str
    arrival_s: float
    duration_s: float
    gpus: int  # per node
    queue: str = "gpu"
    nodes: int = 1

    @property
    def total_gpus(self) -> int:
        """The job's whole width: what it holds at once, and what its work is counted on."""
        return self.gpus * self.nodes

    @property
    def work_gpu_s(self) -> float:
        return self.total_gpus * self.duration_s


def gang_of(
    key: str, team: str, arrival_s: float, duration_s: float, gpus: int, *, machine_gpus: int = MACHINE_GPUS
) -> TraceTask:
    """A trace job as one task: as it is when it fits one machine, otherwise a gang of
    ceil(gpus / machine_gpus) ranks with an equal share each. A width that does not
    divide evenly (12 GPUs: 2 x 6) is rounded up to whole ranks (9 GPUs: 2 x 5), as a
    user would ask for it; the trace's Philly and Alibaba wide jobs are multiples of 8."""
    if gpus <= machine_gpus:
        return TraceTask(key, team, arrival_s, duration_s, gpus)
    nodes = -(-gpus // machine_gpus)
    return TraceTask(key, team, arrival_s, duration_s, -(-gpus // nodes), nodes=nodes)


@dataclass(frozen=True)
class Workload:
    name: str
    tasks: tuple[TraceTask, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    job_unit: str = "job"  # what the trace calls one of its jobs, for the gang note

    @property
    def teams(self) -> tuple[str, ...]:
        return tuple(sorted({t.team for t in self.tasks}))

    def first_days(self, days: float | None) -> Workload:
        """Only the tasks that arrive in the first `days` days (they run to completion)."""
        if days is None:
            return self
        if days <= 0:
            raise InvalidInput(f"--days must be positive, got {days:g}")
        cutoff = days * 86400.0
        kept = tuple(t for t in self.tasks if t.arrival_s < cutoff)
        # The gang count is the slice's own, not the whole trace's.
        notes = [n for n in self.notes if GANG_MARK not in n]
        note = gang_note(kept, self.job_unit)
        return Workload(
            f"{self.name} (first {days:g} days)", kept, tuple(notes + ([note] if note else [])), self.job_unit
        )


GANG_MARK = "run as gangs"


def gang_note(tasks: tuple[TraceTask, ...] | list[TraceTask], unit: str) -> str | None:
    """How many of these tasks are gangs, in words; None if none is."""
    gangs = [t for t in tasks if t.nodes > 1]
    if not gangs:
        return None
    lo, hi = min(t.nodes for t in gangs), max(t.nodes for t in gangs)
    span = f"{lo}" if lo == hi else f"{lo}-{hi}"
    return f"{len(gangs)} {unit}(s) wider than one machine {GANG_MARK} of {span} machines (all ranks start together)"


KINDS = {
    "philly": "a directory of Philly per-VC traces (vc/<vc>.trace and simulation_throughputs.json "
    "beside vc/, as in shared/data/traces/philly-vc-gavel)",
    "alibaba": "the Alibaba GPU v2023 pod list CSV (openb_pod_list_default.csv)",
    "synthetic": "a seed and optional size, e.g. synthetic:7 or synthetic:7:200 (seed:tasks)",
}


def load_workload(spec: str, *, seed: int = 0) -> Workload:
    """`KIND:PATH` -> Workload, or a one-line InvalidInput."""
    kind, sep, arg = spec.partition(":")
    if not sep or kind not in KINDS:
        raise InvalidInput(f"--workload {spec!r}: expected KIND:PATH with KIND one of {', '.join(KINDS)}")
    loader: Callable[[str, int], Workload]
    if kind == "synthetic":
        from autoscaler.sim.synthetic import from_spec

        loader = from_spec
    else:
        path = Path(arg)
        if not arg or not path.exists():
            raise InvalidInput(
                f"--workload {kind}:{arg}: {arg or '(empty path)'} does not exist; {kind} expects {KINDS[kind]}"
            )
        if kind == "philly":
            from autoscaler.sim.philly import load_philly

            return load_philly(path)
        from autoscaler.sim.alibaba import load_alibaba

        return load_alibaba(path)
    return loader(arg, seed)
