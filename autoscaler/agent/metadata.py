"""Cloud metadata services: the instance's id and the preemption notice.

- AWS IMDSv2: a session token from `PUT /latest/api/token`, then
  `GET /latest/meta-data/instance-id` and `GET /latest/meta-data/spot/instance-action`
  (404 until AWS schedules the stop, then `{"action": ..., "time": ...}`; the time is
  the notice's deadline, two minutes after it is posted), and at registration
  `GET /latest/dynamic/instance-identity/{document,signature}`.
- GCP: `GET /computeMetadata/v1/instance/id` and `.../instance/preempted`
  (`TRUE` once preempted), with the header `Metadata-Flavor: Google`. The flag carries
  no time: GCP stops the VM 30 s after the preemption starts, so the deadline is
  counted from when the agent first saw the flag.
- Azure: `GET /metadata/instance/compute/vmId` and Scheduled Events
  `GET /metadata/scheduledevents` (an event of type `Preempt`), header `Metadata: true`;
  its `NotBefore` (an RFC 1123 date, at least 30 s ahead) is the deadline.

Each notice is a `Notice`: a short description (it ends up in the instance's history)
and the deadline, when the cloud says or implies one.

The base URL is configurable so tests point it at fakes on 127.0.0.1. A metadata
service that does not answer is logged, never fatal: the heartbeat timeout on the
server is the backstop when a notice is missed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import httpx

from autoscaler.agent.errors import AgentError

log = logging.getLogger("autoscaler.agent")
LINK_LOCAL = "http://169.254.169.254"
IMDS_TOKEN_TTL_S = 21600
# GCP gives a preempted VM 30 s between the preemption notice and the hard stop.
GCP_NOTICE_S = 30.0


@dataclass(frozen=True)
class Notice:
    """A preemption notice: what the cloud said, and when the machine goes (UTC), if known."""

    reason: str
    deadline: datetime | None = None


class MetadataService(Protocol):
    provider: str

    def instance_id(self) -> str: ...

    def preemption_notice(self) -> Notice | None:
        """The notice, or None while there is none."""

    def identity(self) -> dict[str, str] | None:
        """The cloud's signed statement of this machine's identity, sent at registration
        (AWS: the instance identity document and signature); None where there is none."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def parse_iso(value: object) -> datetime | None:
    """An ISO 8601 time such as AWS's `2026-03-10T12:02:00Z`, as UTC; None if unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        at = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


def parse_rfc1123(value: object) -> datetime | None:
    """An HTTP date such as Azure's `Tue, 10 Mar 2026 12:00:30 GMT`, as UTC; None if unreadable."""
    if not isinstance(value, str) or not value.strip():
        return None
    try:
        at = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)


class _Base:
    provider = ""

    def identity(self) -> dict[str, str] | None:
        return None  # GCP's identity JWT and Azure's attested data: not sent by this agent yet

    def __init__(self, base_url: str | None, timeout_s: float = 2.0, *, wall: Callable[[], datetime] = _utcnow) -> None:
        self.base_url = (base_url or LINK_LOCAL).rstrip("/")
        self.wall = wall
        # Metadata services are link-local and never behind a proxy.
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout_s, trust_env=False)

    def _get(self, path: str, headers: dict[str, str], params: dict[str, str] | None = None) -> httpx.Response:
        return self._http.get(path, headers=headers, params=params)

    def _required(self, response: httpx.Response, what: str) -> str:
        if response.status_code != 200 or not response.text.strip():
            raise AgentError(
                f"the {self.provider} metadata service at {self.base_url} answered {response.status_code} "
                f"for "
                f"{what}; pass --instance-id or set instance_id in the bootstrap file"
            )
        return response.text.strip()

    def _unreachable(self, exc: Exception) -> AgentError:
        return AgentError(
            f"cannot reach the {self.provider} metadata service at {self.base_url} "
            f"({exc.__class__.__name__}); pass --instance-id or set metadata_url"
        )


class AwsImds(_Base):
    provider = "aws"

    def _token(self) -> str:
        r = self._http.put("/latest/api/token", headers={"X-aws-ec2-metadata-token-ttl-seconds": str(IMDS_TOKEN_TTL_S)})
        r.raise_for_status()
        return r.text.strip()

    def instance_id(self) -> str:
        try:
            token = self._token()
            r = self._get("/latest/meta-data/instance-id", {"X-aws-ec2-metadata-token": token})
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._required(r, "instance-id")

    def preemption_notice(self) -> Notice | None:
        # A fresh token each poll: polls are seconds apart and tokens are cheap, and a
        # cached token that expired would silently hide a notice.
        r = self._get("/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": self._token()})
        if r.status_code == 404:
            return None
        r.raise_for_status()
        body: dict[str, Any] = r.json()
        reason = f"aws spot {body.get('action', 'stop')} at {body.get('time', '?')}"
        return Notice(reason, parse_iso(body.get("time")))

    def identity(self) -> dict[str, str] | None:
        try:
            headers = {"X-aws-ec2-metadata-token": self._token()}
            doc = self._get("/latest/dynamic/instance-identity/document", headers)
            sig = self._get("/latest/dynamic/instance-identity/signature", headers)
        except httpx.HTTPError as exc:
            log.warning("no instance identity document from IMDS (%s)", exc.__class__.__name__)
            return None
        if doc.status_code != 200 or sig.status_code != 200:
            log.warning("no instance identity document from IMDS (%d, %d)", doc.status_code, sig.status_code)
            return None
        return {"document": doc.text, "signature": sig.text.strip()}


class GcpMetadata(_Base):
    provider = "gcp"
    HEADERS = {"Metadata-Flavor": "Google"}

    def instance_id(self) -> str:
        try:
            r = self._get("/computeMetadata/v1/instance/id", self.HEADERS)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._required(r, "instance/id")

    def preemption_notice(self) -> Notice | None:
        r = self._get("/computeMetadata/v1/instance/preempted", self.HEADERS)
        r.raise_for_status()
        if r.text.strip().upper() != "TRUE":
            return None
        return Notice("gcp instance preempted", self.wall() + timedelta(seconds=GCP_NOTICE_S))


class AzureImds(_Base):
    provider = "azure"
    HEADERS = {"Metadata": "true"}

    def instance_id(self) -> str:
        try:
            r = self._get(
                "/metadata/instance/compute/vmId",
                self.HEADERS,
                {"api-version": "2021-02-01", "format": "text"},
            )
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None
        return self._required(r, "compute/vmId")

    def preemption_notice(self) -> Notice | None:
        r = self._get("/metadata/scheduledevents", self.HEADERS, {"api-version": "2020-07-01"})
        r.raise_for_status()
        for event in r.json().get("Events", []):
            if event.get("EventType") == "Preempt":
                event_id, not_before = event.get("EventId", "?"), event.get("NotBefore") or "?"
                # NotBefore is empty once the event has started: the deadline is unknown then.
                return Notice(f"azure Preempt event {event_id} not before {not_before}", parse_rfc1123(not_before))
        return None


SERVICES: dict[str, Callable[..., MetadataService]] = {
    "aws": AwsImds,
    "gcp": GcpMetadata,
    "azure": AzureImds,
}


def metadata_service(provider: str, base_url: str | None) -> MetadataService | None:
    """The provider's metadata service, or None for local, slurm and static machines."""
    make = SERVICES.get(provider)
    return make(base_url) if make is not None else None
