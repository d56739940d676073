"""Each channel kind against its real receiver on 127.0.0.1, routes, backoff, config."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from autoscaler.config import NotificationsConfig, RetryConfig, parse_config
from autoscaler.errors import ConfigError
from autoscaler.notify.channels import AlertMessage, DeliveryError, send, sign
from autoscaler.notify.deliver import retry_delay, send_test
from autoscaler.notify.due import channels_for
from tests.conftest import TEST_CONFIG
from tests.notify.conftest import SECRET, channels_yaml
from tests.notify.receivers import SMTP_PASSWORD, Alertmanager, HttpReceiver, SmtpServer

NOW = datetime(2026, 3, 10, 12, 0, tzinfo=UTC)
MSG = AlertMessage(
    id=7,
    key="budget/vision/2026-03/actual/80",
    kind="budget",
    level="warning",
    message="vision has spent 81% of its hard monthly budget of $1000 (threshold 80%)",
    created_at=NOW,
    deployment="test",
    team="vision",
    period="2026-03",
    threshold_pct=80.0,
    basis="actual",
)


@pytest.fixture(autouse=True)
def _secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEST_HOOK_SECRET", SECRET)
    monkeypatch.setenv("TEST_SMTP_PASSWORD", SMTP_PASSWORD)


def _config(
    hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer, am: Alertmanager | None = None
) -> NotificationsConfig:
    return parse_config(TEST_CONFIG + channels_yaml(hook, slack, smtp, am), Path("t.yaml")).notifications


def test_webhook_body_is_documented_json_signed_with_hmac(
    hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer
) -> None:
    ch = _config(hook, slack, smtp).channel("hook")
    assert ch is not None
    send(ch, MSG)
    (got,) = hook.received
    assert got.headers["x-autoscaler-signature"] == sign(SECRET, got.raw)
    assert got.headers["x-autoscaler-alert"] == MSG.key
    assert got.json == {
        "version": "1",
        "deployment": "test",
        "id": 7,
        "key": "budget/vision/2026-03/actual/80",
        "kind": "budget",
        "level": "warning",
        "team": "vision",
        "period": "2026-03",
        "threshold_pct": 80.0,
        "basis": "actual",
        "message": MSG.message,
        "details": {},
        "created_at": "2026-03-10T12:00:00+00:00",
        "test": False,
    }


def test_webhook_with_the_wrong_secret_is_refused_and_reported(
    hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ch = _config(hook, slack, smtp).channel("hook")
    assert ch is not None
    monkeypatch.setenv("TEST_HOOK_SECRET", "wrong")
    with pytest.raises(DeliveryError, match="HTTP 401"):
        send(ch, MSG)
    assert hook.rejected == 1 and hook.received == []
    monkeypatch.delenv("TEST_HOOK_SECRET")
    with pytest.raises(DeliveryError, match="TEST_HOOK_SECRET"):
        send(ch, MSG)


def test_slack_compatible_webhook_gets_text(hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer) -> None:
    ch = _config(hook, slack, smtp).channel("chat")
    assert ch is not None
    send(ch, MSG)
    (got,) = slack.received
    assert set(got.json) == {"text"}
    assert "WARNING" in got.json["text"] and "team vision" in got.json["text"] and MSG.message in got.json["text"]


def test_email_over_starttls_with_auth(hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer) -> None:
    ch = _config(hook, slack, smtp).channel("mail")
    assert ch is not None
    send(ch, MSG)
    (mail,) = smtp.box.messages
    assert smtp.box.logins == ["alerts"]
    assert mail["To"] == "finops@example.org, oncall@example.org"
    assert mail["X-Autoscaler-Alert"] == MSG.key
    assert "WARNING" in mail["Subject"] and "team vision" in mail["Subject"]
    assert MSG.message in mail.get_payload()


def test_email_with_a_wrong_password_or_no_tls_trust_fails(
    hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    ch = _config(hook, slack, smtp).channel("mail")
    assert ch is not None
    monkeypatch.setenv("TEST_SMTP_PASSWORD", "nope")
    with pytest.raises(DeliveryError, match="SMTPAuthenticationError"):
        send(ch, MSG)
    untrusted = ch.model_copy(update={"ca_file": None, "password": SMTP_PASSWORD})
    with pytest.raises(DeliveryError, match="CERTIFICATE_VERIFY_FAILED"):
        send(untrusted, MSG)
    assert smtp.box.messages == []


def test_alertmanager_lists_the_alert(
    hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer, alertmanager: Alertmanager
) -> None:
    ch = _config(hook, slack, smtp, alertmanager).channel("am")
    assert ch is not None
    send(ch, MSG.__class__(**{**MSG.__dict__, "created_at": datetime.now(UTC)}))
    (alert,) = alertmanager.alerts()
    assert alert["labels"]["alertname"] == "AutoscalerBudget"
    assert alert["labels"]["team"] == "vision" and alert["labels"]["severity"] == "warning"
    assert alert["labels"]["threshold_pct"] == "80" and alert["labels"]["basis"] == "actual"
    assert alert["annotations"]["description"] == MSG.message
    assert alert["status"]["state"] == "active"


def test_a_receiver_that_is_down_is_a_delivery_error(hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer) -> None:
    ch = _config(hook, slack, smtp).channel("chat")
    assert ch is not None
    slack.stop()
    with pytest.raises(DeliveryError, match="ConnectError"):
        send(ch, MSG)


def test_send_test_names_the_channel(hook: HttpReceiver, slack: HttpReceiver, smtp: SmtpServer) -> None:
    config = parse_config(TEST_CONFIG + channels_yaml(hook, slack, smtp, None), Path("t.yaml"))
    send_test(config, "hook", NOW)
    (got,) = hook.received
    assert got.json["test"] is True and got.json["kind"] == "test" and "hook" in got.json["message"]
    with pytest.raises(DeliveryError, match="no channel named 'nope'"):
        send_test(config, "nope", NOW)


def test_routes_per_team_and_level() -> None:
    text = (
        TEST_CONFIG
        + """
notifications:
  channels:
    - {name: a, type: webhook, url: 'http://127.0.0.1:1/a'}
    - {name: b, type: slack, url: 'http://127.0.0.1:1/b'}
    - {name: c, type: alertmanager, url: 'http://127.0.0.1:1'}
  routes:
    - {channels: [a], teams: [vision]}
    - {channels: [b], levels: [critical]}
    - {channels: [c], teams: ['-'], kinds: [fail_safe, pool_backoff]}
"""
    )
    n = parse_config(text, Path("t.yaml")).notifications
    assert channels_for(n, kind="budget", team="vision", level="info") == ["a"]
    assert channels_for(n, kind="budget", team="vision", level="critical") == ["a", "b"]
    assert channels_for(n, kind="budget", team="nlp", level="warning") == []
    assert channels_for(n, kind="fail_safe", team=None, level="critical") == ["b", "c"]
    unrouted = NotificationsConfig.model_validate({"channels": n.model_dump(by_alias=True)["channels"]})
    assert channels_for(unrouted, kind="budget", team="nlp", level="info") == ["a", "b", "c"]


def test_config_refuses_unknown_channels_and_duplicates() -> None:
    bad_route = TEST_CONFIG + "notifications:\n  channels: []\n  routes: [{channels: [ghost]}]\n"
    with pytest.raises(ConfigError, match="unknown channel 'ghost'"):
        parse_config(bad_route, Path("t.yaml"))
    dup = (
        TEST_CONFIG
        + "notifications:\n  channels:\n    - {name: x, type: slack, url: u}\n    - {name: x, type: slack, url: v}\n"
    )
    with pytest.raises(ConfigError, match="duplicate channel"):
        parse_config(dup, Path("t.yaml"))
    with pytest.raises(ConfigError, match=r"notifications\.channels\.0"):
        parse_config(TEST_CONFIG + "notifications:\n  channels: [{name: x, type: pager}]\n", Path("t.yaml"))


def test_retry_backoff_doubles_up_to_the_cap() -> None:
    r = RetryConfig(initial_s=10, max_s=60)
    assert [retry_delay(r, n) for n in (1, 2, 3, 4, 5)] == [10, 20, 40, 60, 60]
