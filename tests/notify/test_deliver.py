"""The delivery job's bookkeeping: backoff between attempts, giving up after
`retry.max_attempts`, a new budget period making new alerts, a channel removed from
the config."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.notify.channels import AlertMessage, DeliveryError
from autoscaler.notify.deliver import deliver_pending
from autoscaler.notify.due import budget_dues, record
from autoscaler.policy.schema import Alert, Decision, EvaluationResult
from autoscaler.state.db import transaction
from autoscaler.state.models import AlertDelivery, AlertEvent
from tests.conftest import TEST_CONFIG

NOTIFY = """
notifications:
  channels:
    - {name: a, type: webhook, url: 'http://127.0.0.1:9/a'}
  retry: {initial_s: 10, max_s: 40, max_attempts: 4}
"""


def _config() -> AutoscalerConfig:
    return parse_config(TEST_CONFIG + NOTIFY, Path("t.yaml"))


def _evaluation(*alerts: Alert) -> EvaluationResult:
    return EvaluationResult(
        decision=Decision(alerts=list(alerts)), revision="r", input_digest="d", eval_ms=0.0, error=None
    )


ALERT = Alert(team="vision", level="warning", threshold_pct=80, basis="actual", message="vision at 80%")


def test_backoff_then_gives_up_after_max_attempts(sessions: sessionmaker[Session]) -> None:
    config = _config()
    clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
    with transaction(sessions) as s:
        record(s, budget_dues(_evaluation(ALERT), clock.now()), now=clock.now(), config=config.notifications)
    calls: list[datetime] = []

    def refuse(channel: object, msg: AlertMessage) -> None:
        calls.append(clock.now())
        raise DeliveryError("HTTP 503: busy")

    for _ in range(120):  # every 1 s for 2 minutes
        deliver_pending(sessions, config, clock, sender=refuse)
        clock.advance(1)
    start = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
    assert [(c - start).total_seconds() for c in calls] == [0, 10, 30, 70]  # 10, 20, then 40 (the cap)
    with sessions() as s:
        (d,) = s.scalars(select(AlertDelivery))
    assert d.status == "failed" and d.attempts == 4 and d.last_error == "HTTP 503: busy"


def test_a_new_period_is_a_new_alert_and_the_same_one_is_not(sessions: sessionmaker[Session]) -> None:
    config = _config()
    march, april = datetime(2026, 3, 20, tzinfo=UTC), datetime(2026, 4, 2, tzinfo=UTC)
    with transaction(sessions) as s:
        assert len(record(s, budget_dues(_evaluation(ALERT), march), now=march, config=config.notifications)) == 1
        assert record(s, budget_dues(_evaluation(ALERT), march), now=march, config=config.notifications) == []
        forecast = ALERT.model_copy(update={"basis": "forecast"})
        assert len(record(s, budget_dues(_evaluation(forecast), march), now=march, config=config.notifications)) == 1
        assert len(record(s, budget_dues(_evaluation(ALERT), april), now=april, config=config.notifications)) == 1
    with sessions() as s:
        keys = sorted(s.scalars(select(AlertEvent.key)))
    assert keys == [
        "budget/vision/2026-03/actual/80",
        "budget/vision/2026-03/forecast/80",
        "budget/vision/2026-04/actual/80",
    ]


def test_a_channel_removed_from_the_config_is_reported(sessions: sessionmaker[Session]) -> None:
    config = _config()
    clock = ManualClock(datetime(2026, 3, 10, 12, 0, tzinfo=UTC))
    with transaction(sessions) as s:
        record(s, budget_dues(_evaluation(ALERT), clock.now()), now=clock.now(), config=config.notifications)
    without = parse_config(TEST_CONFIG, Path("t.yaml"))
    (outcome,) = deliver_pending(sessions, without, clock)
    assert outcome.error == "channel 'a' is no longer configured"
