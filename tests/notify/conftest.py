from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from autoscaler.policy.service import PolicyService
from autoscaler.state.db import make_engine, session_factory
from tests.notify.receivers import Alertmanager, HttpReceiver, SmtpServer
from tests.reconciler.harness import policy_service

SECRET = "hook-secret"


@pytest.fixture
def hook() -> Iterator[HttpReceiver]:
    r = HttpReceiver(secret=SECRET).start()
    yield r
    r.stop()


@pytest.fixture
def slack() -> Iterator[HttpReceiver]:
    r = HttpReceiver().start()
    yield r
    r.stop()


@pytest.fixture
def smtp(tmp_path: Path) -> Iterator[SmtpServer]:
    server = SmtpServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    if not Alertmanager.available():
        pytest.skip("prometheus-alertmanager is not installed (scripts/ensure-alertmanager.sh installs it)")
    am = Alertmanager(tmp_path).start()
    yield am
    am.stop()


def channels_yaml(hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer, alertmanager: Alertmanager | None) -> str:
    am = f"    - {{name: am, type: alertmanager, url: '{alertmanager.url}'}}\n" if alertmanager else ""
    return (
        "notifications:\n"
        "  channels:\n"
        f"    - {{name: hook, type: webhook, url: '{hook.url}', secret_env: TEST_HOOK_SECRET}}\n"
        f"    - {{name: chat, type: slack, url: '{slack.url}'}}\n"
        f"    - {{name: mail, type: email, host: 127.0.0.1, port: {smtp.port}, ca_file: '{smtp.cert}',\n"
        "       username: alerts, password_env: TEST_SMTP_PASSWORD, from: autoscaler@example.org,\n"
        "       to: [finops@example.org, oncall@example.org]}\n"
        f"{am}"
        "  retry: {initial_s: 5, max_s: 60}\n"
    )


@pytest.fixture(scope="module")
def shipped_policy() -> Iterator[PolicyService]:
    svc = policy_service()
    yield svc
    svc.close()


@pytest.fixture
def sqlite_sessions(sqlite_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(sqlite_url)
    yield session_factory(engine)
    engine.dispose()
