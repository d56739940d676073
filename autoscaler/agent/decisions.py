"""Pure decisions of the agent: how an attempt ended, how long to back off, how to
cut output into uploads. Plain data in, plain data out; no clock, no I/O."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Literal

from autoscaler.agent.wire import FinishBody, LogChunk

StopCause = Literal["canceled", "timeout", "drain", "spot", "reclaim", "abandoned"]
# What the agent keeps back from a spot notice's deadline, per cloud, to deliver the
# tasks' reports and deregister before the machine goes (`--preempt-margin` overrides).
PREEMPT_MARGIN_S = {"aws": 10.0, "gcp": 5.0, "azure": 5.0}
DEFAULT_PREEMPT_MARGIN_S = 5.0
MIN_PREEMPT_GRACE_S = 1.0


@dataclass(frozen=True)
class StopRequest:
    """Why the agent is stopping a task. The first request wins: a task canceled by
    its user and then caught by a drain deadline is still canceled."""

    cause: StopCause
    detail: str = ""


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def finish_report(stop: StopRequest | None, returncode: int) -> FinishBody:
    """The report for an attempt whose process ended with `returncode` (negative: signal).

    A task the agent stopped for a drain deadline or a spot notice is `interrupted`
    whatever its exit code: a clean exit 0 after SIGTERM usually means "checkpointed",
    not "done", and reporting it as success is the closest peer's bug.
    """
    died = f"killed by {_signal_name(returncode)}" if returncode < 0 else f"exit code {returncode}"
    code = max(-255, min(255, returncode))
    if stop is None:
        return FinishBody(reason="exit", exit_code=code, detail=died if returncode < 0 else "")
    if stop.cause in ("drain", "spot", "reclaim"):
        return FinishBody(reason="interrupted", exit_code=code, detail=stop.cause)
    if stop.cause == "timeout":
        return FinishBody(reason="timeout", exit_code=code, detail=f"{stop.detail}; {died}".strip("; "))
    return FinishBody(reason="canceled", exit_code=code, detail=f"{stop.detail}; {died}".strip("; "))


def preempt_margin_s(provider: str, override_s: float | None) -> float:
    """The margin kept back from a notice's deadline: the flag's, else the cloud's default."""
    if override_s is not None:
        return override_s
    return PREEMPT_MARGIN_S.get(provider, DEFAULT_PREEMPT_MARGIN_S)


def preempt_grace_s(left_s: float | None, *, margin_s: float, fallback_s: float) -> float:
    """SIGTERM -> SIGKILL on a spot notice: the time the notice leaves (`left_s`, seconds
    to its deadline) minus the margin, so a checkpoint may use the whole notice and the
    agent still has `margin_s` to report and deregister. A notice without a time, or
    with one already past (a skewed clock), gets `fallback_s` (`--preempt-grace`)."""
    if left_s is None or left_s <= 0:
        return fallback_s
    return max(left_s - margin_s, min(MIN_PREEMPT_GRACE_S, left_s))


def start_failed_report(detail: str) -> FinishBody:
    return FinishBody(reason="start_failed", detail=detail[:2000])


def backoff_s(failures: int, *, base_s: float, cap_s: float, jitter: float = 0.0) -> float:
    """Exponential backoff after `failures` consecutive failures; `jitter` in [0, 1)
    (drawn by the caller) spreads a fleet's retries so they do not arrive together."""
    if failures <= 0:
        return 0.0
    delay = min(cap_s, base_s * 2.0 ** (failures - 1))
    return delay * (1 - jitter / 2)


def cut_uploads(chunks: list[LogChunk], max_chars: int) -> list[list[LogChunk]]:
    """Merge neighbouring pieces of the same stream and cut them into uploads of at
    most `max_chars` characters each (the server's per-request limit)."""
    merged: list[LogChunk] = []
    for c in chunks:
        if merged and merged[-1].stream == c.stream:
            merged[-1] = LogChunk(stream=c.stream, data=merged[-1].data + c.data)
        elif c.data:
            merged.append(c)
    uploads: list[list[LogChunk]] = []
    current: list[LogChunk] = []
    size = 0
    for c in merged:
        data = c.data
        while data:
            room = max_chars - size
            if room <= 0:
                uploads.append(current)
                current, size = [], 0
                room = max_chars
            piece, data = data[:room], data[room:]
            current.append(LogChunk(stream=c.stream, data=piece))
            size += len(piece)
    if current:
        uploads.append(current)
    return uploads


def gpu_env(gpu_indices: list[int]) -> dict[str, str]:
    """Pin a task to its GPUs. NVML numbers GPUs in PCI bus order while CUDA by default
    puts the fastest first, so CUDA is told to use PCI order too; a task with no GPUs
    sees none rather than all of them."""
    return {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices),
    }
