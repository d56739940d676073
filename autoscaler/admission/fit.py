"""Does a task fit a machine: GPUs, GPU type, CPUs and memory. Pure.

GPU types are matched by whole words after normalising (case, the vendor name and
punctuation are ignored): a task asking for `A100` fits `NVIDIA A100-SXM4-80GB` and
`a100 80gb` fits it too, but `A10` does not fit `A10G` and `H100` does not fit
`GH100`: a substring rule once let those through. `GPU_TYPE_ALIASES` lists the
other names a type is known by (docs/api.md shows the table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# Other spellings users write -> the words the driver reports.
# (A100-80GB needs none: it is the words "a100 80gb" already.)
GPU_TYPE_ALIASES: dict[str, str] = {
    "h100-sxm": "h100 hbm3",  # the SXM part reports itself as "NVIDIA H100 80GB HBM3"
    "a100-sxm": "a100 sxm4",
    "a100-pcie": "a100 pcie",
    "v100-sxm": "v100 sxm2",
    "rtx6000": "rtx 6000",
}
_VENDOR = re.compile(r"\b(nvidia|tesla|geforce)\b")
_SEP = re.compile(r"[^a-z0-9]+")


@lru_cache(maxsize=4096)
def _words(model: str) -> tuple[str, ...]:
    text = model.strip().lower()
    text = GPU_TYPE_ALIASES.get(text, text)
    text = _VENDOR.sub(" ", text)
    return tuple(w for w in _SEP.split(text) if w)


@lru_cache(maxsize=4096)
def gpu_type_matches(wanted: str | None, offered: str | None) -> bool:
    """True when a task asking for `wanted` may run on a GPU reported as `offered`.

    No wish matches anything; a wish never matches a machine without a GPU type."""
    if not wanted:
        return True
    if not offered:
        return False
    want = _words(wanted)
    have = set(_words(offered))
    return bool(want) and all(w in have for w in want)


@dataclass(frozen=True, slots=True)
class Need:
    """What one task asks for. Zero CPUs or memory means "no request"."""

    gpus: int = 0
    gpu_type: str | None = None
    cpus: float = 0.0
    memory_mb: int = 0


@dataclass(frozen=True, slots=True)
class Room:
    """What a machine has (or has free). `cpus`/`memory_mb` None: not reported, so a
    request for them cannot be checked and is not refused on that account."""

    gpus: int
    gpu_type: str | None
    cpus: float | None = None
    memory_mb: int | None = None


def misfit(need: Need, room: Room) -> str | None:
    """Why `need` does not fit `room`, or None when it fits."""
    if need.gpus > room.gpus:
        return f"needs {need.gpus} GPU(s), has {room.gpus}"
    if need.gpus > 0 and not gpu_type_matches(need.gpu_type, room.gpu_type):
        return f"needs GPU type {need.gpu_type}, has {room.gpu_type or 'none'}"
    if need.cpus > 0 and room.cpus is not None and need.cpus > room.cpus + 1e-9:
        return f"needs {need.cpus:g} CPU(s), has {room.cpus:g}"
    if need.memory_mb > 0 and room.memory_mb is not None and need.memory_mb > room.memory_mb:
        return f"needs {need.memory_mb} MB of memory, has {room.memory_mb}"
    return None


def fits(need: Need, room: Room) -> bool:
    return misfit(need, room) is None
