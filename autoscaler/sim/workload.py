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

# The largest machine in the default catalog has 8 GPUs; a trace job asking for more is
# split into 8-GPU tasks of the same run time (gang scheduling is not modelled).
MAX_TASK_GPUS = 8


@dataclass(frozen=True)
class TraceTask:
    """One unit of work: enqueued at `arrival_s` (seconds from the trace start), runs for
    `duration_s` once it starts, on `gpus` GPUs of one machine."""

    key: str
    team: str
    arrival_s: float
    duration_s: float
    gpus: int
    queue: str = "gpu"
    part_of: str = ""  # the trace job's key when the job was split (wider than a machine)


@dataclass(frozen=True)
class Workload:
    name: str
    tasks: tuple[TraceTask, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    split_unit: str = "job"  # what the trace calls one of its jobs, for the split note

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
        # The split count is the slice's own, not the whole trace's.
        notes = [n for n in self.notes if SPLIT_MARK not in n]
        note = split_note(kept, self.split_unit)
        return Workload(
            f"{self.name} (first {days:g} days)", kept, tuple(notes + ([note] if note else [])), self.split_unit
        )


SPLIT_MARK = f"wider than {MAX_TASK_GPUS} GPUs split"


def split_note(tasks: tuple[TraceTask, ...] | list[TraceTask], unit: str) -> str | None:
    """How many of these tasks' trace jobs were split, in words; None if none was."""
    n = len({t.part_of for t in tasks if t.part_of})
    return f"{n} {unit}(s) {SPLIT_MARK} into {MAX_TASK_GPUS}-GPU tasks" if n else None


def split_wide(key: str, team: str, arrival_s: float, duration_s: float, gpus: int) -> list[TraceTask]:
    """A job wider than one machine becomes ceil(gpus / 8) tasks of at most 8 GPUs."""
    if gpus <= MAX_TASK_GPUS:
        return [TraceTask(key, team, arrival_s, duration_s, gpus)]
    parts = -(-gpus // MAX_TASK_GPUS)
    return [
        TraceTask(f"{key}.{i}", team, arrival_s, duration_s, min(MAX_TASK_GPUS, gpus - i * MAX_TASK_GPUS), part_of=key)
        for i in range(parts)
    ]


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
