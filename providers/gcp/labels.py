"""GCP names and labels: what the Compute API accepts, derived deterministically.

Label keys and values allow only lowercase letters, digits, `_` and `-` (keys must start
with a letter, both at most 63 characters); instance names must match
`[a-z]([-a-z0-9]*[a-z0-9])?`. `requestId` must be a UUID. Everything here is derived from
the launch request id so that a retried launch produces the same name and requestId.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping

_NOT_ALLOWED = re.compile(r"[^a-z0-9_-]")
# A fixed namespace: requestIds derived from the same launch request id must never change.
_REQUEST_NAMESPACE = uuid.UUID("6f1d2c1e-8a55-4d9b-9a57-3c4e2f0a7b10")


def label_key(key: str) -> str:
    out = _NOT_ALLOWED.sub("_", key.lower())[:63]
    return out if out[:1].isalpha() else ("k" + out)[:63]


def label_value(value: str) -> str:
    return _NOT_ALLOWED.sub("_", value.lower())[:63]


def labels_from_tags(tags: Mapping[str, str]) -> dict[str, str]:
    return {label_key(k): label_value(v) for k, v in tags.items()}


def instance_name(prefix: str, request_id: str, index: int) -> str:
    """`<prefix>-<readable part of the request id>-<hash>-<index>`, at most 63 characters.

    The hash keeps two request ids that sanitise to the same text apart.
    """
    slug = re.sub(r"[^a-z0-9]+", "-", request_id.lower()).strip("-")[:28].strip("-")
    digest = hashlib.sha256(request_id.encode()).hexdigest()[:8]
    name = "-".join(p for p in (prefix, slug, digest, str(index)) if p)
    return name[:63]


def operation_request_id(request_id: str, index: int, verb: str = "insert") -> str:
    """The UUID GCP deduplicates on for the `index`-th instance of a launch request."""
    return str(uuid.uuid5(_REQUEST_NAMESPACE, f"{verb}/{request_id}/{index}"))
