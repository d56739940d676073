"""Fake cloud metadata services on 127.0.0.1: AWS IMDSv2, GCP and Azure IMDS with
Scheduled Events. Each is as strict as the real one about its headers (IMDSv2 token,
`Metadata-Flavor: Google`, `Metadata: true`), so an agent that forgets them fails
here as it would in the cloud. `arm()` announces a preemption, with a deadline
`notice_s` from now where the cloud gives one (AWS's instance-action time, Azure's
NotBefore; GCP's flag has none)."""

from __future__ import annotations

import json
import secrets
import threading
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse


class FakeMetadata:
    def __init__(self, provider: str, instance_id: str = "i-0fake", identity: dict[str, str] | None = None) -> None:
        if provider not in ("aws", "gcp", "azure"):
            raise ValueError(f"no fake metadata service for {provider!r}")
        self.provider = provider
        self.instance_id = instance_id
        # AWS: the instance identity document and signature served (tests/fakes/aws_identity.py).
        self.identity = identity
        self.armed = False
        self.deadline: datetime | None = None
        self.requests: list[tuple[str, str, int]] = []
        self._tokens: set[str] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                fake._answer(self, "PUT")

            def do_GET(self) -> None:
                fake._answer(self, "GET")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeMetadata:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def arm(self, notice_s: float | None = None) -> None:
        """From now on, the service announces that this instance is being preempted, by
        the cloud's usual notice (AWS 120 s, Azure 30 s) or `notice_s` from now."""
        lead = notice_s if notice_s is not None else {"aws": 120.0, "azure": 30.0}.get(self.provider, 30.0)
        self.deadline = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=lead)
        self.armed = True

    def polls(self) -> int:
        """How many preemption checks were answered 200 so far."""
        notice = {
            "aws": "/latest/meta-data/spot/instance-action",
            "gcp": "/computeMetadata/v1/instance/preempted",
            "azure": "/metadata/scheduledevents",
        }[self.provider]
        return sum(1 for _, path, status in self.requests if path == notice and status in (200, 404))

    # -- protocol -------------------------------------------------------------------
    def _answer(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = urlparse(h.path).path
        status, body, ctype = getattr(self, f"_{self.provider}")(h, method, path)
        self.requests.append((method, path, status))
        data = body.encode()
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        h.wfile.write(data)

    def _aws(self, h: BaseHTTPRequestHandler, method: str, path: str) -> tuple[int, str, str]:
        if method == "PUT" and path == "/latest/api/token":
            if not h.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                return 400, "missing TTL header", "text/plain"
            token = secrets.token_hex(16)
            self._tokens.add(token)
            return 200, token, "text/plain"
        if method != "GET":
            return 405, "", "text/plain"
        if h.headers.get("X-aws-ec2-metadata-token") not in self._tokens:
            return 401, "", "text/plain"  # IMDSv2 only: no token, no answer
        if path == "/latest/meta-data/instance-id":
            return 200, self.instance_id, "text/plain"
        if path == "/latest/dynamic/instance-identity/document" and self.identity:
            return 200, self.identity["document"], "text/plain"
        if path == "/latest/dynamic/instance-identity/signature" and self.identity:
            return 200, self.identity["signature"] + "\n", "text/plain"
        if path == "/latest/meta-data/spot/instance-action":
            if not self.armed:
                return 404, "Not Found", "text/plain"
            assert self.deadline is not None
            when = self.deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
            return 200, json.dumps({"action": "terminate", "time": when}), "application/json"
        return 404, "Not Found", "text/plain"

    def _gcp(self, h: BaseHTTPRequestHandler, method: str, path: str) -> tuple[int, str, str]:
        if h.headers.get("Metadata-Flavor") != "Google":
            return 403, "Missing Metadata-Flavor:Google header.", "text/plain"
        if path == "/computeMetadata/v1/instance/id":
            return 200, self.instance_id, "application/text"
        if path == "/computeMetadata/v1/instance/preempted":
            return 200, "TRUE" if self.armed else "FALSE", "application/text"
        return 404, "Not Found", "text/plain"

    def _azure(self, h: BaseHTTPRequestHandler, method: str, path: str) -> tuple[int, str, str]:
        if h.headers.get("Metadata") != "true":
            return (
                400,
                json.dumps({"error": "Bad request. Required metadata header not specified"}),
                "application/json",
            )
        if "api-version=" not in h.path:
            return (
                400,
                json.dumps({"error": "Bad request. api-version was not specified"}),
                "application/json",
            )
        if path == "/metadata/instance/compute/vmId":
            return 200, self.instance_id, "text/plain"
        if path == "/metadata/scheduledevents":
            events = []
            if self.armed:
                events.append(
                    {
                        "EventId": "A123BC45-1234-5678-AB90-ABCDEF123456",
                        "EventType": "Preempt",
                        "ResourceType": "VirtualMachine",
                        "Resources": ["vm-1"],
                        "EventStatus": "Scheduled",
                        "NotBefore": format_datetime(self.deadline or datetime.now(UTC), usegmt=True),
                        "Description": "",
                        "EventSource": "Platform",
                        "DurationInSeconds": -1,
                    }
                )
            return (
                200,
                json.dumps({"DocumentIncarnation": 2 if self.armed else 1, "Events": events}),
                "application/json",
            )
        return 404, "Not Found", "text/plain"
