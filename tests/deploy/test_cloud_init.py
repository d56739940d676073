"""The agent cloud-init, rendered through the providers' own renderer, against the image.

The template and renderer belong to providers/; these checks tie them to what the
image installs: the unit it starts is the unit the image ships, and user-data holds
no credential but the one-time join token (or only a reference to it).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from providers.bootstrap import AGENT_FILE, BootstrapSpec, JoinTokenRef, render_user_data
from tests.deploy.conftest import AGENT_IMAGE

UNIT_NAME = "autoscaler-agent.service"
JOIN = "asj_" + "x" * 43
# Prefixes of every long-lived token kind (autoscaler.auth.tokens.PREFIX) and common
# cloud credential shapes; none may appear in user-data.
FORBIDDEN = [
    r"asa_",
    r"ast_",
    r"asw_",
    r"AKIA[0-9A-Z]{16}",
    r"aws_secret_access_key",
    r"-----BEGIN",
    r"client_secret",
    r"password",
]


def _render(**kw: object) -> str:
    spec = BootstrapSpec(
        server_url="https://gpu.example.com",
        pool="burst",
        provider="aws",
        instance_id="i-0abc",
        labels={"team": "vision"},
        **kw,
    )  # type: ignore[arg-type]
    return render_user_data(spec, template=AGENT_IMAGE / "cloud-init.yaml.tmpl")


@pytest.mark.parametrize(
    "kw", [{"join_token": JOIN}, {"join_token_ref": JoinTokenRef(kind="aws-ssm", name="/demo/join/i-0abc")}]
)
def test_rendered_cloud_init_is_valid_and_starts_the_baked_unit(kw: dict[str, object]) -> None:
    text = _render(**kw)
    assert text.startswith("#cloud-config\n")
    doc = yaml.safe_load(text)
    (entry,) = [f for f in doc["write_files"] if f["path"] == AGENT_FILE]
    assert str(entry["permissions"]) == "0600"
    agent = json.loads(entry["content"])
    assert agent["server_url"] == "https://gpu.example.com" and agent["pool"] == "burst"
    started = [" ".join(c) if isinstance(c, list) else c for c in doc["runcmd"]]
    assert any("start" in c.split() or "--now" in c.split() for c in started if UNIT_NAME in c), started
    assert (AGENT_IMAGE / "files" / UNIT_NAME).is_file()
    assert AGENT_FILE in (AGENT_IMAGE / "files" / UNIT_NAME).read_text()


def test_no_secret_but_the_join_token() -> None:
    text = _render(join_token=JOIN)
    for pattern in FORBIDDEN:
        assert not re.search(pattern, text, re.IGNORECASE), pattern
    assert re.findall(r"as[a-z]_[A-Za-z0-9_-]+", text) == [JOIN]


def test_with_a_secret_store_reference_no_token_at_all() -> None:
    text = _render(join_token_ref=JoinTokenRef(kind="aws-ssm", name="/demo/join/i-0abc"))
    assert "asj_" not in text
    agent = json.loads(next(f for f in yaml.safe_load(text)["write_files"] if f["path"] == AGENT_FILE)["content"])
    assert agent["join_token"] is None
    assert agent["join_token_ref"] == {"kind": "aws-ssm", "name": "/demo/join/i-0abc"}
