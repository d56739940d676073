"""Loader for the Alibaba GPU cluster trace v2023 pod list (`openb_pod_list_default.csv`).

A pod becomes a task: arrival = creation_time, run time = deletion_time -
scheduled_time, GPUs = num_gpu (a fractional `gpu_milli` share is rounded up to a
whole GPU: clouds rent whole GPUs). The trace has no team column, so the QoS class
(LS, BE, Burstable, Guaranteed) stands in for the team. CPU-only pods and pods never
scheduled are skipped and counted in the notes. Pods still running at the trace end
have a censored run time (they end at the trace end).
"""

from __future__ import annotations

import csv
from pathlib import Path

from autoscaler.errors import InvalidInput
from autoscaler.sim.workload import TraceTask, Workload, gang_note, gang_of

COLUMNS = ("name", "num_gpu", "qos", "creation_time", "deletion_time", "scheduled_time")


def load_alibaba(path: Path) -> Workload:
    if path.is_dir():
        path = path / "openb_pod_list_default.csv"
    tasks: list[TraceTask] = []
    cpu_only = unscheduled = 0
    try:
        with path.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise InvalidInput(
                    f"--workload alibaba:{path}: not an Alibaba pod list (missing column(s) "
                    f"{', '.join(missing)}); expected openb_pod_list_default.csv"
                )
            for row in reader:
                gpus = int(row["num_gpu"] or 0)
                if gpus <= 0:
                    cpu_only += 1
                    continue
                if not row["scheduled_time"] or not row["deletion_time"]:
                    unscheduled += 1
                    continue
                start, end = float(row["scheduled_time"]), float(row["deletion_time"])
                if end <= start:
                    unscheduled += 1
                    continue
                team = (row["qos"] or "unknown").lower()
                tasks.append(gang_of(row["name"], team, float(row["creation_time"]), end - start, gpus))
    except OSError as exc:
        raise InvalidInput(f"--workload alibaba:{path}: cannot read it ({exc.strerror})") from None
    except (ValueError, KeyError) as exc:
        raise InvalidInput(f"--workload alibaba:{path}: a row is not a valid pod record ({exc})") from None
    tasks.sort(key=lambda t: (t.arrival_s, t.key))
    notes = ["QoS class as team; fractional GPUs rounded up to one whole GPU"]
    if cpu_only:
        notes.append(f"{cpu_only} CPU-only pod(s) skipped")
    if unscheduled:
        notes.append(f"{unscheduled} pod(s) never scheduled or with no run time skipped")
    if note := gang_note(tasks, "pod"):
        notes.append(note)
    return Workload(f"alibaba ({len(tasks)} GPU tasks)", tuple(tasks), tuple(notes), job_unit="pod")
