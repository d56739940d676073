"""Transfer tickets: what a worker presents to fetch or store one object, instead of
any credential of the store.

A ticket is a signed statement "this worker may GET (or PUT) this one object of this
task's attempt until then": base64url(JSON) + "." + HMAC-SHA256, keyed by a key
derived from the server's secret key ring (so every server process of a deployment
checks the others' tickets). An upload ticket is also checked against the database
when used: it only works while that attempt is still the task's live attempt on that
worker, so it dies with the attempt, whatever its expiry says. A gang's ticket also
names the worker's rank: it works only while that worker holds that rank of that
attempt (so a worker of another gang, or of the gang's earlier attempt, cannot use it).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import asdict, dataclass
from typing import Literal

from autoscaler.errors import Forbidden

_LABEL = b"autoscaler transfer ticket v1"


@dataclass(frozen=True)
class Ticket:
    op: Literal["get", "put"]
    key: str  # the store key: the one object this ticket reaches
    task_id: str
    attempt: int
    worker_id: str
    expires: float  # unix seconds
    # A put: what the stored object becomes (an artifact of the task).
    kind: str = ""
    name: str = ""
    # A gang's: the worker's rank of that attempt (None: a single-node task's ticket).
    rank: int | None = None


def transfer_key(sealing_key: bytes) -> bytes:
    """A key for tickets only, derived from the server's sealing key (never the key itself)."""
    return hmac.new(sealing_key, _LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sign(ticket: Ticket, key: bytes) -> str:
    body = _b64(json.dumps(asdict(ticket), separators=(",", ":"), sort_keys=True).encode())
    mac = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    return f"{body}.{mac}"


def verify(text: str, key: bytes, *, now: float, op: str) -> Ticket:
    """The ticket, if it is genuine, unexpired and for `op`; Forbidden otherwise."""
    body, _, mac = text.partition(".")
    expected = _b64(hmac.new(key, body.encode(), hashlib.sha256).digest())
    if not mac or not hmac.compare_digest(mac, expected):
        raise Forbidden("this transfer ticket is not valid: ask the server for a new lease")
    try:
        ticket = Ticket(**json.loads(_unb64(body)))
    except (ValueError, TypeError, binascii.Error):
        raise Forbidden("this transfer ticket is not valid: ask the server for a new lease") from None
    if ticket.op != op:
        raise Forbidden(f"this transfer ticket is for {ticket.op}, not {op}")
    if now > ticket.expires:
        raise Forbidden("this transfer ticket expired: it was for an earlier attempt or lease")
    return ticket
