"""Loader for the Microsoft Philly per-virtual-cluster traces (Gavel's `vc/*.trace`).

Each VC becomes a team named after its file. A job's run time is its step count divided
by its V100 throughput alone (`simulation_throughputs.json`, key `('<job_type>', <gpus>)`,
entry `null`), as in the Gavel simulator; `throughput` says which entry applies when the
table does not list the job's own scale factor. Every VC's clock starts at 0, so VCs
overlay as concurrent teams. A job wider than one machine is one gang task (`gang_of`):
its run time is the whole job's (its own scale factor's throughput), on every rank.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from autoscaler.errors import InvalidInput
from autoscaler.sim.workload import TraceTask, Workload, gang_note, gang_of

GPU_BASIS = "v100"
THROUGHPUTS = "simulation_throughputs.json"


def _find(path: Path) -> tuple[list[Path], Path]:
    vc_dir = path / "vc" if (path / "vc").is_dir() else path
    traces = sorted(vc_dir.glob("*.trace"))
    table = next((p for p in (vc_dir / THROUGHPUTS, vc_dir.parent / THROUGHPUTS) if p.is_file()), None)
    if not traces or table is None:
        raise InvalidInput(
            f"--workload philly:{path}: expected a directory with vc/<vc>.trace files and "
            f"{THROUGHPUTS} (found {len(traces)} trace(s), "
            f"{'a' if table else 'no'} throughput table)"
        )
    return traces, table


def _team(stem: str) -> str:
    name = re.sub(r"[^a-z0-9_.-]", "-", stem.lower()).strip("-._") or "vc"
    return name if name[0].isalnum() else f"vc{name}"


def _rates(table: dict[str, Any]) -> dict[str, dict[int, float]]:
    """Job type -> {scale factor: steps per second alone}, from the table's keys."""
    out: dict[str, dict[int, float]] = {}
    for key, entry in table.items():
        m = _KEY.fullmatch(key)
        rate = entry.get("null") if isinstance(entry, dict) else None
        if m is None or not isinstance(rate, int | float) or rate <= 0:
            continue
        out.setdefault(m.group(1), {})[int(m.group(2))] = float(rate)
    return out


_KEY = re.compile(r"\('(.*)', (\d+)\)")


def throughput(rates: dict[int, float], gpus: int) -> float | None:
    """Steps per second of a job on `gpus` GPUs: the table's entry for that scale factor
    where it is listed; otherwise the largest listed scale factor below it, scaled
    linearly (16 GPUs run twice as fast as the 8-GPU entry). Linear is optimistic for
    jobs that cross machines, but the 1-GPU entry the loader used before made a 32-GPU
    job run as long as on one GPU, inflating the trace's work by about 1.4x. None when
    no entry at or below `gpus` exists."""
    if gpus in rates:
        return rates[gpus]
    below = [k for k in rates if k < gpus]
    if not below:
        return None
    base = max(below)
    return rates[base] * gpus / base


def load_philly(path: Path) -> Workload:
    traces, table_path = _find(path)
    try:
        table: dict[str, Any] = json.loads(table_path.read_text())[GPU_BASIS]
        rates = _rates(table)
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise InvalidInput(f"{table_path}: cannot read the {GPU_BASIS} throughput table ({exc})") from None
    tasks: list[TraceTask] = []
    missing = 0
    for trace in traces:
        team = _team(trace.stem)
        for n, line in enumerate(trace.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            cols = line.split("\t")
            try:
                job_type, steps, arrival, gpus = cols[0], int(cols[4]), float(cols[5]), int(cols[6])
            except (IndexError, ValueError):
                raise InvalidInput(
                    f"{trace}:{n}: expected 7 tab-separated columns (job_type, command, "
                    "num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor)"
                ) from None
            rate = throughput(rates.get(job_type, {}), gpus)
            if rate is None:
                missing += 1
                continue
            tasks.append(gang_of(f"{team}-{n}", team, arrival, steps / rate, gpus))
    tasks.sort(key=lambda t: (t.arrival_s, t.key))
    notes = [
        f"{len(traces)} virtual clusters as teams; run time = steps / V100 throughput at the job's scale factor (linear above the largest listed)"
    ]
    if note := gang_note(tasks, "job"):
        notes.append(note)
    if missing:
        notes.append(f"{missing} job(s) without a throughput entry skipped")
    return Workload(f"philly ({len(traces)} VCs)", tuple(tasks), tuple(notes))
