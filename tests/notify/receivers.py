"""Real receivers for the channels, all on 127.0.0.1: an HTTP receiver (generic webhook
with HMAC check, or Slack-compatible), an SMTP server (aiosmtpd, STARTTLS and AUTH),
and Debian's prometheus-alertmanager started as a process."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import shutil
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, Envelope, LoginPassword, Session

from tests.conftest import free_port

SMTP_USER, SMTP_PASSWORD = "alerts", "s3cret-pass"


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


class HttpReceiver:
    """Records each POST; with `secret`, answers 401 to a body whose signature is wrong."""

    def __init__(self, secret: str | None = None, port: int | None = None) -> None:
        self.secret = secret
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.received: list[Received] = []
        self.rejected = 0
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> HttpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                if receiver.secret is not None:
                    want = "sha256=" + hmac.new(receiver.secret.encode(), raw, hashlib.sha256).hexdigest()
                    if not hmac.compare_digest(want, headers.get("x-autoscaler-signature", "")):
                        receiver.rejected += 1
                        self.send_response(401)
                        self.end_headers()
                        return
                receiver.received.append(Received(self.path, headers, raw))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 (and localhost) and its key, as PEM files."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "smtp.crt", directory / "smtp.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@dataclass
class MailBox:
    messages: list[Message] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Session, envelope: Envelope) -> str:
        content = envelope.original_content or b""
        self.messages.append(message_from_bytes(content))
        return "250 OK"


class SmtpServer:
    """aiosmtpd on 127.0.0.1 requiring STARTTLS and AUTH PLAIN."""

    def __init__(self, directory: Path) -> None:
        self.cert, key = self_signed(directory)
        self.box = MailBox()
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(self.cert, key)
        self.port = free_port()

        def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, auth_data: Any) -> AuthResult:
            ok = isinstance(auth_data, LoginPassword) and (
                auth_data.login.decode(),
                auth_data.password.decode(),
            ) == (SMTP_USER, SMTP_PASSWORD)
            if ok:
                self.box.logins.append(auth_data.login.decode())
            # handled=False: aiosmtpd answers a failure with 535 itself.
            return AuthResult(success=ok, handled=False)

        self.controller = Controller(
            self.box,
            hostname="127.0.0.1",
            port=self.port,
            tls_context=tls,
            require_starttls=True,
            authenticator=authenticate,
            auth_required=True,
            # smtplib falls back from PLAIN to LOGIN with an initial response, which
            # aiosmtpd's LOGIN does not take (both then wait): offer PLAIN only.
            auth_exclude_mechanism=["LOGIN"],
        )

    def start(self) -> SmtpServer:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()


class Alertmanager:
    """Debian's prometheus-alertmanager on a free port, with a do-nothing receiver."""

    BINARY = "prometheus-alertmanager"

    @classmethod
    def available(cls) -> bool:
        return shutil.which(cls.BINARY) is not None

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.cluster_port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Alertmanager:
        conf = self.dir / "alertmanager.yml"
        conf.write_text("route:\n  receiver: none\nreceivers:\n  - name: none\n")
        (self.dir / "am-data").mkdir(exist_ok=True)
        self.log = (self.dir / "alertmanager.log").open("wb")
        self.proc = subprocess.Popen(
            [
                self.BINARY,
                f"--config.file={conf}",
                f"--storage.path={self.dir / 'am-data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                f"--cluster.listen-address=127.0.0.1:{self.cluster_port}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("alertmanager did not start: " + (self.dir / "alertmanager.log").read_text()[-2000:])

    def alerts(self) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.url}/api/v2/alerts", timeout=5)
        resp.raise_for_status()
        result: list[dict[str, Any]] = resp.json()
        return result

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()
