"""The four channel kinds: what each one sends for an alert, and how.

Every sender takes an `AlertMessage` (the documented JSON body, see docs/operations.md)
and raises `DeliveryError` when the receiver did not take it; the delivery job retries.
No database here: a sender is called outside any transaction.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import smtplib
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from email.message import EmailMessage
from typing import Any

import httpx

from autoscaler.config import AlertmanagerChannel, ChannelConfig, EmailChannel, SlackChannel, WebhookChannel
from autoscaler.ledger.period import parse_month

SIGNATURE_HEADER = "X-Autoscaler-Signature"
SCHEMA_VERSION = "1"


class DeliveryError(Exception):
    """The receiver did not accept the alert (down, refused, wrong answer)."""


@dataclass(frozen=True)
class AlertMessage:
    id: int
    key: str
    kind: str
    level: str
    message: str
    created_at: datetime
    deployment: str
    team: str | None = None
    period: str | None = None
    threshold_pct: float | None = None
    basis: str | None = None
    details: dict[str, Any] | None = None
    test: bool = False

    def body(self) -> dict[str, Any]:
        """The generic webhook's JSON body (schema version 1)."""
        return {
            "version": SCHEMA_VERSION,
            "deployment": self.deployment,
            "id": self.id,
            "key": self.key,
            "kind": self.kind,
            "level": self.level,
            "team": self.team,
            "period": self.period,
            "threshold_pct": self.threshold_pct,
            "basis": self.basis,
            "message": self.message,
            "details": self.details or {},
            "created_at": self.created_at.isoformat(),
            "test": self.test,
        }

    def title(self) -> str:
        who = f"team {self.team}" if self.team else "fleet"
        what = f"{self.kind} {self.threshold_pct:g}% ({self.basis})" if self.threshold_pct is not None else self.kind
        return f"[{self.deployment}] {self.level.upper()}: {who}: {what}" + (" (test)" if self.test else "")


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: `sha256=` + hex HMAC-SHA256 of the exact body bytes."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _env(name: str | None) -> str | None:
    return os.environ.get(name) if name else None


def _post(url: str, content: bytes, headers: dict[str, str], timeout_s: float) -> None:
    try:
        resp = httpx.post(url, content=content, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc
    if resp.status_code >= 300:
        raise DeliveryError(f"HTTP {resp.status_code}: {resp.text[:200]}")


def send_webhook(ch: WebhookChannel, msg: AlertMessage) -> None:
    body = json.dumps(msg.body(), sort_keys=True).encode()
    headers = {"Content-Type": "application/json", **ch.headers, "X-Autoscaler-Alert": msg.key}
    secret = ch.secret or _env(ch.secret_env)
    if ch.secret_env and not secret:
        raise DeliveryError(f"environment variable {ch.secret_env} (the HMAC secret) is not set")
    if secret:
        headers[SIGNATURE_HEADER] = sign(secret, body)
    _post(ch.url, body, headers, ch.timeout_s)


def send_slack(ch: SlackChannel, msg: AlertMessage) -> None:
    url = ch.url or _env(ch.url_env)
    if not url:
        raise DeliveryError(f"no webhook URL: set url or the environment variable {ch.url_env}")
    icon = {"critical": ":rotating_light:", "warning": ":warning:"}.get(msg.level, ":information_source:")
    text = f"{icon} *{msg.title()}*\n{msg.message}"
    _post(url, json.dumps({"text": text}).encode(), {"Content-Type": "application/json"}, ch.timeout_s)


def send_email(ch: EmailChannel, msg: AlertMessage) -> None:
    mail = EmailMessage()
    mail["From"] = ch.sender
    mail["To"] = ", ".join(ch.to)
    mail["Subject"] = msg.title()
    mail["X-Autoscaler-Alert"] = msg.key
    lines = [msg.message, ""] + [f"{k}: {v}" for k, v in msg.body().items() if k != "message" and v is not None]
    mail.set_content("\n".join(lines) + "\n")
    username = ch.username or _env(ch.username_env)
    password = ch.password or _env(ch.password_env)
    try:
        with smtplib.SMTP(ch.host, ch.port, timeout=ch.timeout_s) as smtp:
            if ch.starttls:
                smtp.starttls(context=ssl.create_default_context(cafile=ch.ca_file))
            if username:
                smtp.login(username, password or "")
            smtp.send_message(mail)
    except (OSError, smtplib.SMTPException) as exc:
        raise DeliveryError(f"{type(exc).__name__}: {exc}") from exc


def alertmanager_alert(ch: AlertmanagerChannel, msg: AlertMessage) -> dict[str, Any]:
    """One alert of the API v2 body; a budget alert stays active until its period ends."""
    ends = msg.created_at + timedelta(seconds=ch.active_for_s)
    if msg.period:
        ends = max(ends, parse_month(msg.period)[1])
    labels = {
        "alertname": "AutoscalerBudget" if msg.kind == "budget" else "Autoscaler" + msg.kind.title().replace("_", ""),
        "severity": msg.level,
        "deployment": msg.deployment,
        "kind": msg.kind,
        "alert_key": msg.key,
    }
    if msg.team:
        labels["team"] = msg.team
    if msg.threshold_pct is not None:
        labels["threshold_pct"] = f"{msg.threshold_pct:g}"
    if msg.basis:
        labels["basis"] = msg.basis
    if msg.period:
        labels["period"] = msg.period
    if msg.test:
        labels["test"] = "true"
    return {
        "labels": labels,
        "annotations": {"summary": msg.title(), "description": msg.message},
        "startsAt": msg.created_at.isoformat(),
        "endsAt": ends.isoformat(),
    }


def send_alertmanager(ch: AlertmanagerChannel, msg: AlertMessage) -> None:
    body = json.dumps([alertmanager_alert(ch, msg)]).encode()
    _post(ch.url.rstrip("/") + "/api/v2/alerts", body, {"Content-Type": "application/json"}, ch.timeout_s)


Sender = Callable[[ChannelConfig, AlertMessage], None]


def send(ch: ChannelConfig, msg: AlertMessage) -> None:
    """Deliver `msg` on `ch`, or raise DeliveryError."""
    if isinstance(ch, WebhookChannel):
        send_webhook(ch, msg)
    elif isinstance(ch, SlackChannel):
        send_slack(ch, msg)
    elif isinstance(ch, EmailChannel):
        send_email(ch, msg)
    else:
        send_alertmanager(ch, msg)
