"""The bootstrap a new machine boots with: cloud-init user-data carrying the agent's file.

Every backend follows the same path: the control plane renders `BootstrapSpec` into the
cloud-init template `agent_image/cloud-init.yaml.tmpl`; a cloud VM's cloud-init writes
`/etc/autoscaler/agent.json` (mode 0600) from it and starts `autoscaler-agent.service`;
the local provider parses the same text back with `parse_user_data` and writes the
file itself. So a local instance exercises the very bytes a VM would get.

The renderer refuses anything but a join token (`asj_` prefix): an admin or team
token pasted by mistake must never reach user-data, which any process on the VM
(and anyone with DescribeInstanceAttribute) can read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Any, Literal
from urllib.parse import urlparse

import yaml

AGENT_FILE = "/etc/autoscaler/agent.json"
AGENT_UNIT = "autoscaler-agent.service"
JOIN_TOKEN_PREFIX = "asj_"
# EC2 refuses user-data over 16 KiB; the others allow more, so this is the bound.
MAX_USER_DATA_BYTES = 16384
# Shipped inside the package so a wheel install has it; agent_image/ links to it.
DEFAULT_TEMPLATE = Path(__file__).resolve().parent / "cloud-init.yaml.tmpl"

ProviderName = Literal["aws", "gcp", "azure", "local", "slurm", "static"]
SecretKind = Literal["aws-ssm", "gcp-secret", "azure-keyvault"]
_PROVIDERS = ("aws", "gcp", "azure", "local", "slurm", "static")
_SECRET_KINDS = ("aws-ssm", "gcp-secret", "azure-keyvault")


class BootstrapError(ValueError):
    """A bootstrap that must not be rendered or cannot be read; the message says why."""


@dataclass(frozen=True)
class JoinTokenRef:
    """Where the agent fetches its join token at boot instead of reading it from user-data."""

    kind: SecretKind
    name: str


@dataclass(frozen=True)
class BootstrapSpec:
    """What one agent needs to join: the fields of the agent's bootstrap file."""

    server_url: str
    pool: str
    provider: ProviderName
    join_token: str | None = None
    join_token_ref: JoinTokenRef | None = None
    instance_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    simulated_gpus: dict[str, Any] | None = None
    metadata_url: str | None = None

    def validate(self) -> None:
        url = urlparse(self.server_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise BootstrapError(f"server_url {self.server_url!r} is not an http(s) URL: set server.public_url")
        if self.provider not in _PROVIDERS:
            raise BootstrapError(f"unknown provider {self.provider!r}; expected one of {', '.join(_PROVIDERS)}")
        if (self.join_token is None) == (self.join_token_ref is None):
            raise BootstrapError("give exactly one of join_token and join_token_ref")
        if self.join_token is not None and not self.join_token.startswith(JOIN_TOKEN_PREFIX):
            raise BootstrapError(
                "only a join token (asj_...) may go into user-data; create one with "
                "`autoscaler token create --join --pool POOL`"
            )
        if self.join_token_ref is not None and self.join_token_ref.kind not in _SECRET_KINDS:
            raise BootstrapError(
                f"unknown join_token_ref kind {self.join_token_ref.kind!r}; expected one of {', '.join(_SECRET_KINDS)}"
            )

    def to_dict(self) -> dict[str, Any]:
        ref = self.join_token_ref
        return {
            "server_url": self.server_url,
            "pool": self.pool,
            "provider": self.provider,
            "join_token": self.join_token,
            "join_token_ref": ({"kind": ref.kind, "name": ref.name} if ref else None),
            "instance_id": self.instance_id,
            "labels": dict(self.labels),
            "simulated_gpus": dict(self.simulated_gpus) if self.simulated_gpus is not None else None,
            "metadata_url": self.metadata_url,
        }


def render_user_data(spec: BootstrapSpec, *, template: Path | None = None) -> str:
    """The cloud-init user-data for one launch."""
    spec.validate()
    path = template or DEFAULT_TEMPLATE
    try:
        text = path.read_text()
    except OSError as exc:
        raise BootstrapError(f"cannot read the cloud-init template {path}: {exc.strerror}") from None
    body = json.dumps(spec.to_dict(), indent=2, sort_keys=True)
    # The JSON goes into a YAML literal block, indented under `content: |`; JSON
    # escapes newlines inside strings, so no value can end the block early.
    indented = "\n".join("      " + line for line in body.splitlines())
    try:
        rendered = Template(text).substitute(agent_json=indented)
    except (KeyError, ValueError) as exc:
        raise BootstrapError(f"cloud-init template {path} has an unknown placeholder: {exc}") from None
    size = len(rendered.encode())
    if size > MAX_USER_DATA_BYTES:
        raise BootstrapError(f"user-data is {size} bytes, over the {MAX_USER_DATA_BYTES}-byte limit: trim the labels")
    return rendered


def parse_user_data(text: str) -> dict[str, Any]:
    """The agent bootstrap dict carried by rendered user-data (what cloud-init would write)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BootstrapError(f"user-data is not valid cloud-init YAML: {exc}") from None
    files = doc.get("write_files") if isinstance(doc, dict) else None
    for entry in files or []:
        if isinstance(entry, dict) and entry.get("path") == AGENT_FILE:
            try:
                data = json.loads(entry.get("content", ""))
            except json.JSONDecodeError as exc:
                raise BootstrapError(f"{AGENT_FILE} in user-data is not valid JSON: {exc}") from None
            if not isinstance(data, dict):
                raise BootstrapError(f"{AGENT_FILE} in user-data is not a JSON object")
            return data
    raise BootstrapError(f"user-data writes no {AGENT_FILE}: render it with providers.bootstrap.render_user_data")


def file_mode(text: str) -> str | None:
    """The permissions cloud-init gives the agent file (tests check it is 0600)."""
    doc = yaml.safe_load(text)
    for entry in doc.get("write_files", []):
        if entry.get("path") == AGENT_FILE:
            mode = entry.get("permissions")
            return str(mode) if mode is not None else None
    return None
