"""The cloud-init bootstrap: what goes into user-data, and that it reads back the same."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from providers.bootstrap import (
    AGENT_UNIT,
    BootstrapError,
    BootstrapSpec,
    JoinTokenRef,
    file_mode,
    parse_user_data,
    render_user_data,
)

TOKEN = "asj_" + "x" * 43


def spec(**kw: object) -> BootstrapSpec:
    base: dict[str, object] = {
        "server_url": "https://scaler.example:8443",
        "pool": "gpu",
        "provider": "aws",
        "join_token": TOKEN,
    }
    base.update(kw)
    return BootstrapSpec(**base)  # type: ignore[arg-type]


def test_round_trip_carries_every_field() -> None:
    s = spec(
        labels={"team": "vision", "odd": 'quote " colon: x\nnewline'},
        simulated_gpus={"count": 2, "model": "Sim", "memory_mb": 1024},
        metadata_url="http://127.0.0.1:9/",
        instance_id="i-1",
    )
    text = render_user_data(s)
    assert text.startswith("#cloud-config\n")
    assert parse_user_data(text) == s.to_dict()


def test_agent_file_is_private_and_the_unit_is_started() -> None:
    text = render_user_data(spec())
    assert file_mode(text) == "0600"
    doc = yaml.safe_load(text)
    assert ["systemctl", "enable", "--now", AGENT_UNIT] in doc["runcmd"]


def test_secret_reference_instead_of_token() -> None:
    ref = JoinTokenRef("aws-ssm", "/autoscaler/join/gpu")
    text = render_user_data(spec(join_token=None, join_token_ref=ref))
    data = parse_user_data(text)
    assert data["join_token"] is None
    assert data["join_token_ref"] == {"kind": "aws-ssm", "name": "/autoscaler/join/gpu"}
    assert "asj_" not in text


@pytest.mark.parametrize("token", ["asa_adminadmin", "ast_teamteam", "asw_worker", "plain"])
def test_refuses_any_token_but_a_join_token(token: str) -> None:
    with pytest.raises(BootstrapError, match="only a join token"):
        render_user_data(spec(join_token=token))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"server_url": "scaler:8080"}, "not an http"),
        ({"provider": "openstack"}, "unknown provider"),
        ({"join_token": None}, "exactly one"),
        ({"join_token_ref": JoinTokenRef("aws-ssm", "n")}, "exactly one"),
        ({"labels": {"big": "x" * 20000}}, "16384-byte limit"),
    ],
)
def test_bad_specs_are_refused_with_a_reason(kw: dict[str, object], message: str) -> None:
    with pytest.raises(BootstrapError, match=message):
        render_user_data(spec(**kw))


def test_template_errors_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "t.tmpl"
    bad.write_text("#cloud-config\n${nope}\n")
    with pytest.raises(BootstrapError, match="unknown placeholder"):
        render_user_data(spec(), template=bad)
    with pytest.raises(BootstrapError, match="cannot read"):
        render_user_data(spec(), template=tmp_path / "missing.tmpl")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("#cloud-config\nwrite_files: [{path: /etc/other, content: x}]\n", "writes no"),
        ("write_files: [{path: /etc/autoscaler/agent.json, content: '{nope'}]\n", "not valid JSON"),
        ("key: [unclosed\n", "not valid cloud-init YAML"),
    ],
)
def test_parse_refuses_foreign_user_data(text: str, message: str) -> None:
    with pytest.raises(BootstrapError, match=message):
        parse_user_data(text)
