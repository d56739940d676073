"""The config file: the shipped example parses; mistakes are named with file, key path and expectation."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoscaler.config import Settings, load_config, parse_config
from autoscaler.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("path", sorted((REPO / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_examples_parse(path: Path) -> None:
    cfg = load_config(path, Settings(config=None, database_url=None))
    assert cfg.pools and cfg.queues


@pytest.mark.parametrize(
    "text,needles",
    [
        ("pools: [\n  {name: a", ["bad.yaml:", "not valid YAML"]),
        ("- just\n- a list\n", ["expected a mapping"]),
        ("pools:\n  - {name: p, provider: fake, max_instance: 3}\n", ["pools.0.max_instance", "Extra inputs"]),
        ("pools:\n  - {name: p, provider: cloudy}\n", ["pools.0.provider", "'local'"]),
        ("pools:\n  - {name: p, provider: fake, min_instances: 5, max_instances: 2}\n", ["min_instances (5) exceeds"]),
        ("queues:\n  - {name: q, pools: [nowhere]}\n", ["unknown pool 'nowhere'"]),
        ("teams: [{name: a}, {name: a}]\n", ["duplicate name 'a'"]),
        ("teams: [{name: Bad Name}]\n", ["teams.0.name", "pattern"]),
        # Pool options are checked against the provider's own model, at their key path.
        (
            "pools:\n  - {name: p, provider: aws, region: us-east-1, options: {subnet: [s-1]}}\n",
            ["at pools.0.options.subnet: unknown option; did you mean 'subnets'?"],
        ),
        (
            "pools:\n  - {name: p, provider: aws, region: us-east-1, options: {max_attempts: 0}}\n",
            ["at pools.0.options.max_attempts: Input should be greater than or equal to 1"],
        ),
        ("pools:\n  - {name: p, provider: gcp, options: {}}\n", ["at pools.0.options.project: Field required"]),
        ("pools:\n  - {name: p, provider: local, options: {gpus: 2}}\n", ["at pools.0.options.gpus: unknown option"]),
        (
            "pools:\n  - {name: a, provider: fake}\n  - {name: b, provider: slurm, options: {partiton: gpu}}\n",
            ["at pools.1.options.partiton: unknown option; did you mean 'partition'?"],
        ),
        (
            "pools:\n  - {name: p, provider: static, options: {machines: [{name: n1, gpu: 8}]}}\n",
            ["at pools.0.options.machines.0.gpu: unknown option; did you mean 'gpus'?"],
        ),
    ],
)
def test_bad_config_messages(text: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(text, Path("bad.yaml"))
    for needle in needles:
        assert needle in info.value.message
    assert "Traceback" not in info.value.message


def test_pool_options_are_checked_by_the_loader_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "autoscaler.yaml"
    path.write_text(
        "pools:\n"
        "  - name: gpu\n"
        "    provider: aws\n"
        "    region: us-east-1\n"
        "    options:\n"
        "      subnets: [subnet-1]\n"
        "      launch_api: spot_fleet\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, Settings(config=None, database_url=None))
    assert info.value.message.splitlines() == [
        f"{path}: invalid configuration",
        "  at pools.0.options.launch_api: Input should be 'fleet' or 'run_instances'",
    ]
    path.write_text(path.read_text().replace("spot_fleet", "run_instances"))
    cfg = load_config(path, Settings(config=None, database_url=None))
    assert cfg.pools[0].options == {"subnets": ["subnet-1"], "launch_api": "run_instances"}


def test_missing_file_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "nope.yaml", Settings(config=None))


def test_environment_overrides(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text("server: {port: 9000}\n")
    monkeypatch.setenv("AUTOSCALER_DATABASE_URL", "postgresql://db/x")
    monkeypatch.setenv("AUTOSCALER_PORT", "9100")
    cfg = load_config(path, Settings())
    assert cfg.database_url == "postgresql://db/x" and cfg.server.port == 9100
