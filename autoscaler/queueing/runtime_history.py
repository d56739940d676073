"""What a task survives and how long it runs, settled at enqueue.

A declared run time is taken as said; otherwise earlier successful runs of the same
work (same team, queue and command, found by `command_key`) feed the estimator of
`autoscaler.planner.runtime_estimate`, whose answer is kept on the task (and shown by
`task show`). The estimate is made once, at enqueue: a task's run time does not
change under it while it waits, and a queue of 10,000 tasks of one command costs one
query per distinct command in a batch, not one per cycle.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from autoscaler.config import CapacityConfig
from autoscaler.errors import InvalidInput
from autoscaler.planner.capacity_choice import Checkpointing
from autoscaler.planner.runtime_estimate import RuntimeEstimate, RuntimePrior, declared, estimate, runtime_class_h
from autoscaler.state.models import Task, TaskAttempt

# The most recent successful runs the estimate looks at: old enough history says
# little about a command whose inputs keep changing, and this bounds the query.
HISTORY_RUNS = 50


@dataclass(frozen=True, slots=True)
class RuntimeDeclaration:
    checkpoints: str | None
    expected_runtime_s: float | None
    command_key: str
    estimate: RuntimeEstimate
    runtime_class_s: float


def runtime_prior(cfg: CapacityConfig) -> RuntimePrior:
    """The config's prior of the run-time estimate."""
    return RuntimePrior(cfg.runtime_prior_h, cfg.runtime_prior_sigma, cfg.runtime_prior_weight)


def command_key(command: Sequence[str]) -> str:
    """A digest of the command, the same for the same program and arguments."""
    return hashlib.sha256(json.dumps(list(command), separators=(",", ":")).encode()).hexdigest()


def checkpoints_of(text: str | None, checkpoint_dir: str | None) -> str | None:
    """The declaration as stored: validated, `on-signal` when only a checkpoint dir is
    given (it is uploaded on the reclaim notice), None for none."""
    if text is None:
        return "on-signal" if checkpoint_dir else None
    try:
        spec = Checkpointing.parse(text)
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None
    return None if spec.mode == "none" else str(spec)


def past_runs_h(session: Session, *, team: str, queue: str, key: str) -> list[float]:
    """Hours of the last attempt of the latest successful runs of the same work."""
    rows = session.execute(
        select(TaskAttempt.started_at, TaskAttempt.ended_at)
        .join(Task, (Task.id == TaskAttempt.task_id) & (TaskAttempt.attempt == Task.attempts))
        .where(Task.team == team, Task.queue == queue, Task.command_key == key, Task.state == "succeeded")
        .where(TaskAttempt.ended_at.is_not(None))
        .order_by(Task.finished_at.desc())
        .limit(HISTORY_RUNS)
    ).all()
    return [(end - start).total_seconds() / 3600.0 for start, end in rows if end is not None]


def settle(
    session: Session,
    *,
    team: str,
    queue: str,
    command: Sequence[str],
    checkpoints: str | None,
    checkpoint_dir: str | None,
    expected_runtime_s: float | None,
    prior: RuntimePrior,
) -> RuntimeDeclaration:
    key = command_key(command)
    if expected_runtime_s is not None:
        if not 0 < expected_runtime_s <= 365 * 86400:
            raise InvalidInput(
                f"expected_runtime_s must be above 0 and at most a year (31536000), not {expected_runtime_s:g}"
            )
        est = declared(expected_runtime_s / 3600.0)
    else:
        est = estimate(past_runs_h(session, team=team, queue=queue, key=key), prior)
    return RuntimeDeclaration(
        checkpoints_of(checkpoints, checkpoint_dir),
        expected_runtime_s,
        key,
        est,
        runtime_class_h(est.mean_h) * 3600.0,
    )
