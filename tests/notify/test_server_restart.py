"""The same "done when" against real processes: `autoscaler up` (fake cloud, the shipped
policies with a hard budget) delivering to a signature-checking webhook receiver, a
Slack-compatible receiver, aiosmtpd and Alertmanager; the server is stopped and started
again in the middle, and the webhook receiver is down for the 100 % crossing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from autoscaler.ledger.period import month_bounds
from autoscaler.policy.bundle import shipped_policy_dir
from autoscaler.state.db import make_engine, session_factory, sqlite_url, transaction
from autoscaler.state.models import AlertDelivery, AlertEvent, SpendRecord
from tests.conftest import TEST_CONFIG, free_port
from tests.notify.conftest import SECRET, channels_yaml
from tests.notify.receivers import SMTP_PASSWORD, Alertmanager, HttpReceiver, SmtpServer
from tests.notify.test_live_loop import HARD


def _wait(what: str, cond: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class Up:
    def __init__(self, config: Path, home: Path) -> None:
        self.config, self.home, self.port = config, home, free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Up:
        env = {**os.environ, "TEST_HOOK_SECRET": SECRET, "TEST_SMTP_PASSWORD": SMTP_PASSWORD}
        self.log = (self.home.parent / f"up-{time.monotonic_ns()}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "autoscaler", "up", "--config", str(self.config), "--home", str(self.home),
             "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
        url = f"http://127.0.0.1:{self.port}/healthz"

        def healthy() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "autoscaler up exited"
            try:
                return httpx.get(url, timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        _wait("autoscaler up", healthy)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None
            self.log.close()


@pytest.mark.timeout(300)
def test_up_restarted_midway_delivers_each_crossing_once(tmp_path: Path) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(shipped_policy_dir(), policies)
    budgets = policies / "data" / "budgets.yaml"
    budgets.write_text(budgets.read_text().replace("teams: {}", "teams:") + HARD)  # the shipped file names no team
    hook, slack = HttpReceiver(secret=SECRET).start(), HttpReceiver().start()
    smtp = SmtpServer(tmp_path).start()
    am = Alertmanager(tmp_path).start() if Alertmanager.available() else None
    config = tmp_path / "autoscaler.yaml"
    config.write_text(
        TEST_CONFIG
        + f"policy: {{dir: '{policies}'}}\n"
        + "reconcile: {interval_s: 0.5, debounce_s: 0.1}\n"
        + channels_yaml(hook, slack, smtp, am).replace(
            "retry: {initial_s: 5, max_s: 60}", "retry: {initial_s: 0.5, max_s: 1}"
        )
        + "  interval_s: 0.3\n"
    )
    home = tmp_path / "home"
    up = Up(config, home).start()
    engine = make_engine(sqlite_url(home))
    sessions = session_factory(engine)
    spent = [0.0]

    def spend_to(usd: float) -> None:
        now = datetime.now(UTC)
        start = max(month_bounds(now)[0], now - timedelta(hours=2))
        with transaction(sessions) as s:
            s.add(SpendRecord(instance_id=f"earlier-{usd:g}", team="vision", pool="gpu-pool", provider="fake",
                              region=None, instance_type="g.1", capacity_type="on_demand", start=start,
                              end=start + timedelta(hours=1), hourly_price=usd - spent[0], cost_usd=usd - spent[0]))  # fmt: skip
        spent[0] = usd

    def delivered(n: int) -> Callable[[], bool]:
        def check() -> bool:
            with sessions() as s:
                rows = list(s.scalars(select(AlertDelivery)))
            return len(rows) >= n and all(d.status == "delivered" for d in rows)

        return check

    channels = 3 + bool(am)
    try:
        spend_to(510)
        _wait("the 50 % alert on every channel", delivered(channels))
        up.stop()  # the restart, in the middle
        spend_to(820)
        up = Up(config, home).start()
        _wait("the 80 % alert on every channel", delivered(2 * channels))
        hook.stop()
        spend_to(1010)

        def hook_retried() -> bool:
            with sessions() as s:
                rows = list(s.scalars(select(AlertDelivery).where(AlertDelivery.channel == "hook")))
            return sum(d.status == "pending" and d.attempts >= 2 for d in rows) >= 3

        _wait("retries to the webhook receiver while it is down", hook_retried)
        hook = HttpReceiver(secret=SECRET, port=hook.port).start()
        _wait("everything delivered", delivered(5 * channels))
        time.sleep(2)  # a few more cycles and delivery runs: nothing new
        with sessions() as s:
            events = list(s.scalars(select(AlertEvent).order_by(AlertEvent.id)))
            assert len(list(s.scalars(select(AlertDelivery)))) == 5 * channels
        keys = sorted(e.key for e in events)
        month = f"{datetime.now(UTC):%Y-%m}"
        assert keys == sorted(
            [f"budget/vision/{month}/actual/{t}" for t in (50, 80, 100)]
            + [f"budget_drain/vision/{month}", f"budget_freeze/vision/{month}"]
        ), keys
        assert sorted(r.json["key"] for r in hook.received) == sorted(k for k in keys if not k.endswith(("/50", "/80")))
        assert hook.rejected == 0
        assert len(slack.received) == 5
        assert sorted(m["X-Autoscaler-Alert"] for m in smtp.box.messages) == keys
        if am is not None:
            assert sorted(a["labels"]["alert_key"] for a in am.alerts()) == keys
    finally:
        up.stop()
        engine.dispose()
        for stop in (hook.stop, slack.stop, smtp.stop, *([am.stop] if am else [])):
            stop()
