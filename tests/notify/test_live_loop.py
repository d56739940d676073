"""The issue's "done when": a live reconcile loop (fake cloud, the shipped budgets
policy) with a team crossing 50, 80 and 100 % of a hard budget delivers exactly one
alert per crossing to each configured channel (the SMTP server receives the mails,
Alertmanager lists the alerts, the webhook receiver verifies the signature), across a
restart in the middle; a receiver that is down is retried and gets the alert when it
comes back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.clock import ManualClock
from autoscaler.config import AutoscalerConfig, parse_config
from autoscaler.ledger.period import month_bounds
from autoscaler.notify.deliver import CLAIM_S, _claim, deliver_pending, delivery_counts, delivery_rows
from autoscaler.policy.service import PolicyService
from autoscaler.state.db import make_engine, session_factory, transaction
from autoscaler.state.models import AlertDelivery, AlertEvent, SpendRecord
from tests.conftest import TEST_CONFIG
from tests.notify.conftest import SECRET, channels_yaml
from tests.notify.receivers import SMTP_PASSWORD, Alertmanager, HttpReceiver, SmtpServer
from tests.reconciler.harness import Rig, make_rig, policy_service

HARD = "  vision:\n    monthly_usd: 1000\n    kind: hard\n"


@pytest.fixture
def policy(tmp_path: Path) -> Iterator[PolicyService]:
    svc = policy_service(tmp_path, HARD)
    yield svc
    svc.close()


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    monkeypatch.setenv("TEST_SMTP_PASSWORD", SMTP_PASSWORD)


def _now() -> datetime:
    """Real time (Alertmanager drops alerts that ended in the past), early enough in its
    month that the test's few minutes never cross into the next one."""
    now = datetime.now(UTC).replace(microsecond=0)
    _, end = month_bounds(now)
    return now if end - now > timedelta(hours=1) else end + timedelta(hours=1)


def _spend_to(rig: Rig, usd: float) -> None:
    """The team's month-to-date spend (from earlier, finished instances) becomes `usd`."""
    with transaction(rig.sessions) as s:
        so_far = sum(r.cost_usd for r in s.scalars(select(SpendRecord).where(SpendRecord.team == "vision")))
        start = month_bounds(rig.clock.now())[0]
        s.add(
            SpendRecord(
                instance_id=f"earlier-{usd:g}",
                team="vision",
                pool="gpu-pool",
                provider="fake",
                region=None,
                instance_type="g.1",
                capacity_type="on_demand",
                start=start,
                end=start + timedelta(hours=1),
                hourly_price=usd - so_far,
                cost_usd=usd - so_far,
            )
        )


def _budget_crossings(keys: list[str]) -> list[str]:
    return sorted(k.split("/")[-1] for k in keys if k.startswith("budget/vision/"))


def test_each_crossing_is_delivered_once_to_every_channel_across_a_restart_and_an_outage(
    tmp_path: Path, db_url: str, policy: PolicyService
) -> None:
    hook, slack = HttpReceiver(secret=SECRET).start(), HttpReceiver().start()
    smtp = SmtpServer(tmp_path).start()
    am = Alertmanager(tmp_path).start() if Alertmanager.available() else None
    try:
        config: AutoscalerConfig = parse_config(TEST_CONFIG + channels_yaml(hook, slack, smtp, am), Path("t.yaml"))
        clock = ManualClock(_now())
        engine = make_engine(db_url)
        rig = make_rig(session_factory(engine), config, clock, policy)

        def cycle_and_deliver(sessions: sessionmaker[Session], times: int = 2) -> None:
            reconciler = rig.reconciler()
            for _ in range(times):  # a crossing seen again adds nothing
                reconciler.run_cycle()
                deliver_pending(sessions, config, clock)
                clock.advance(15)

        cycle_and_deliver(rig.sessions)
        with rig.sessions() as s:
            assert delivery_rows(s) == []
        _spend_to(rig, 510)
        cycle_and_deliver(rig.sessions)

        # A restart: a new process, with nothing in memory and its own connection pool.
        engine.dispose()
        engine = make_engine(db_url)
        rig.sessions = session_factory(engine)
        _spend_to(rig, 820)
        cycle_and_deliver(rig.sessions)

        # The webhook receiver goes down before the hard budget is spent.
        hook.stop()
        _spend_to(rig, 1010)
        cycle_and_deliver(rig.sessions, times=3)
        with rig.sessions() as s:
            down = [
                d
                for d in s.scalars(select(AlertDelivery).where(AlertDelivery.channel == "hook"))
                if d.status == "pending"
            ]
            assert down and all(d.attempts >= 2 and "ConnectError" in (d.last_error or "") for d in down)
            assert delivery_counts(s)[("hook", "pending")] == len(down)
        # It comes back; the next attempt (after its backoff) gets through.
        hook = HttpReceiver(secret=SECRET, port=hook.port).start()
        clock.advance(120)
        deliver_pending(rig.sessions, config, clock)

        with rig.sessions() as s:
            events = list(s.scalars(select(AlertEvent).order_by(AlertEvent.id)))
            deliveries = list(s.scalars(select(AlertDelivery)))
        keys = [e.key for e in events]
        assert _budget_crossings(keys) == ["100", "50", "80"], keys
        assert {e.kind for e in events} == {"budget", "budget_drain", "budget_freeze"}, keys
        assert len(keys) == len(set(keys)) == 5
        assert all(d.status == "delivered" for d in deliveries)
        assert Counter(d.channel for d in deliveries) == {c: 5 for c in ("hook", "chat", "mail", "am")[: 3 + bool(am)]}

        # Every receiver got each alert exactly once.
        hook_keys = [r.json["key"] for r in hook.received]
        assert hook_keys == [e.key for e in events if e.kind != "budget" or e.threshold_pct == 100]
        assert hook.rejected == 0  # every body's HMAC signature verified
        assert len(slack.received) == 5
        mail_keys = [m["X-Autoscaler-Alert"] for m in smtp.box.messages]
        assert sorted(mail_keys) == sorted(keys)
        if am is not None:
            listed = [a["labels"]["alert_key"] for a in am.alerts()]
            assert sorted(listed) == sorted(keys)
            thresholds = {a["labels"].get("threshold_pct") for a in am.alerts() if a["labels"]["kind"] == "budget"}
            assert thresholds == {"50", "80", "100"}

        # Later cycles in the same period send nothing more.
        before = (len(hook.received), len(slack.received), len(smtp.box.messages))
        cycle_and_deliver(rig.sessions)
        assert (len(hook.received), len(slack.received), len(smtp.box.messages)) == before
        engine.dispose()
    finally:
        for stop in (hook.stop, slack.stop, smtp.stop, *([am.stop] if am else [])):
            stop()


def test_a_sender_that_died_after_claiming_leaves_the_row_to_another_process(
    tmp_path: Path, sqlite_url: str, policy: PolicyService
) -> None:
    hook = HttpReceiver(secret=SECRET).start()
    try:
        text = (
            TEST_CONFIG
            + f"notifications:\n  channels:\n    - {{name: hook, type: webhook, url: '{hook.url}', secret: {SECRET}}}\n"
        )
        config = parse_config(text, Path("t.yaml"))
        clock = ManualClock(_now())
        rig = make_rig(session_factory(make_engine(sqlite_url)), config, clock, policy)
        _spend_to(rig, 600)
        rig.reconciler().run_cycle()
        with transaction(rig.sessions) as s:
            (claimed,) = _claim(s, clock.now(), 10, "test")  # process A claims, then dies
        other = session_factory(make_engine(sqlite_url))  # process B
        assert deliver_pending(other, config, clock) == []
        assert hook.received == []
        clock.advance(CLAIM_S + 1)
        (outcome,) = deliver_pending(other, config, clock)
        assert outcome.error is None and outcome.delivery_id == claimed[0]
        assert [r.json["threshold_pct"] for r in hook.received] == [50]
        assert deliver_pending(other, config, clock) == []
    finally:
        hook.stop()
