"""FinOps what-ifs the simulator plays (`simulate --checkpoints-share P`,
`--expected-runtime-known`): which tasks checkpoint on the spot notice, and what a task
declares about itself when it is enqueued.

The choice of checkpointing tasks is drawn from its own seeded stream (not the world's),
so asking "what if 30 % checkpointed" does not also move every boot delay and reclaim.
"""

from __future__ import annotations

import random

from autoscaler.errors import InvalidInput
from autoscaler.sim.workload import Workload

# Offset from the run's seed: the world uses `seed`, the ClearML-style baseline `seed + 1`.
_CHECKPOINT_STREAM = 7919


def checkpointing_keys(workload: Workload, share: float, seed: int) -> frozenset[str]:
    """Keys of the tasks that checkpoint on the notice: each with probability `share`,
    drawn in trace order from the seed (the same seed always picks the same tasks)."""
    if not 0.0 <= share <= 1.0:
        raise InvalidInput(f"--checkpoints-share must be between 0 and 1 (a share of tasks), got {share:g}")
    if share == 0.0:
        return frozenset()
    if share == 1.0:
        return frozenset(t.key for t in workload.tasks)
    rng = random.Random(seed + _CHECKPOINT_STREAM)
    return frozenset(t.key for t in workload.tasks if rng.random() < share)


def checkpoint_every_s(key: str, global_every_s: float | None, keys: frozenset[str]) -> float | None:
    """What a stopped attempt of this task keeps, in `engine.kept_s` terms: the global
    `--checkpoint-every` when given, else 0 (everything, on the notice) for a task drawn
    to checkpoint, else None (restart from zero)."""
    if global_every_s is not None:
        return global_every_s
    return 0.0 if key in keys else None
