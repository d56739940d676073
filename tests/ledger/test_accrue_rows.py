"""The ledger's per-cycle paths read column rows and write with executemany (issue 20):
what a caller's session already holds must not go stale, a machine that is only
known later is still found by the burn rate, and accruing in steps inside one
transaction gives what one accrual gives."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.config import AutoscalerConfig
from autoscaler.ledger import accrue, burn_rate, month_to_date
from autoscaler.queueing import tasks as task_ops
from autoscaler.state.db import transaction
from autoscaler.state.models import Instance, SpendRecord, TaskAttempt
from tests.conftest import make_context
from tests.ledger.test_attribution import HOUR, T0, _machine, _worker


def _lease(sessions: sessionmaker[Session], worker: str, *, team: str, gpus: int) -> str:
    with transaction(sessions) as s:
        task_ops.enqueue(s, task_ops.TaskSpec(queue="gpu", command=["x"], gpus=gpus), team=team, now=T0)
    with transaction(sessions) as s:
        task = task_ops.lease(s, worker, now=T0)
        assert task is not None
        task_ops.mark_started(s, worker, task.id, now=T0)
        return task.id


def _nlp_on_half_a_vision_machine(config: AutoscalerConfig, sessions: sessionmaker[Session]) -> None:
    """A 4 USD/h, 2-GPU machine of team vision, one GPU of it running an nlp task since T0."""
    make_context(config, sessions)
    with transaction(sessions) as s:
        inst = _machine(s, team="vision", gpus=2, price=4.0, at=T0)
        worker = _worker(s, inst, gpus=2, at=T0)
    _lease(sessions, worker, team="nlp", gpus=1)


def test_entities_loaded_before_accrue_show_what_it_wrote(
    config: AutoscalerConfig, sessions: sessionmaker[Session]
) -> None:
    _nlp_on_half_a_vision_machine(config, sessions)
    with transaction(sessions) as s:
        accrue(s, now=T0 + HOUR / 2, since=T0)
    with transaction(sessions) as s:
        attempt = s.scalars(select(TaskAttempt)).one()
        records = list(s.scalars(select(SpendRecord).order_by(SpendRecord.id)))
        assert attempt.cost_usd == pytest.approx(1.0)
        accrue(s, now=T0 + HOUR, since=T0 + HOUR / 2)
        # The same objects, re-read: half the 4 USD/h machine for an hour is nlp's.
        assert attempt.cost_usd == pytest.approx(2.0) and attempt.gpu_hours == pytest.approx(1.0)
        assert {(r.team, r.kind): round(r.cost_usd, 6) for r in records} == {
            ("nlp", "usage"): 2.0,
            ("vision", "unused"): 2.0,
        }


def test_accruing_in_steps_in_one_transaction_equals_one_accrual(
    config: AutoscalerConfig, sessions: sessionmaker[Session]
) -> None:
    """The second step reads the segments the first wrote with plain statements."""
    _nlp_on_half_a_vision_machine(config, sessions)
    with transaction(sessions) as s:
        for minutes in (10, 25, 60, 90):
            accrue(s, now=T0 + timedelta(minutes=minutes), since=T0)
    with sessions() as s:
        rows = list(s.scalars(select(SpendRecord)))
        attempt = s.scalars(select(TaskAttempt)).one()
        assert len(rows) == 2  # extended, never duplicated
        assert month_to_date(s, T0) == pytest.approx({"nlp": 3.0, "vision": 3.0})
        assert attempt.cost_usd == pytest.approx(3.0)
        assert max(r.end for r in rows) == T0 + timedelta(minutes=90)


def test_burn_rate_finds_the_machine_of_an_attempt_not_linked_yet(
    config: AutoscalerConfig, sessions: sessionmaker[Session]
) -> None:
    """An attempt leased before its worker was linked to an instance is charged to that
    instance's price as soon as the link can be made, by the burn rate too."""
    make_context(config, sessions)
    with transaction(sessions) as s:
        inst = _machine(s, team="vision", gpus=2, price=4.0, at=T0, provider_instance_id="pi-late")
        worker = _worker(s, inst, gpus=2, at=T0)
        inst.provider_instance_id = None
        inst.worker_id = None
    _lease(sessions, worker, team="nlp", gpus=1)
    with transaction(sessions) as s:
        assert s.scalars(select(TaskAttempt.instance_id)).all() == [None]
        s.get_one(Instance, inst.id).provider_instance_id = "pi-late"
    with sessions() as s:
        assert burn_rate(s) == pytest.approx({"nlp": 2.0, "vision": 2.0})
        # Read only: the burn rate does not link it; accrue does.
        assert s.scalars(select(TaskAttempt.instance_id)).all() == [None]
    with transaction(sessions) as s:
        accrue(s, now=T0 + HOUR, since=T0)
    with sessions() as s:
        assert s.scalars(select(TaskAttempt.instance_id)).all() == [inst.id]
        assert burn_rate(s) == pytest.approx({"nlp": 2.0, "vision": 2.0})
