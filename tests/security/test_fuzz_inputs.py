"""Hypothesis fuzzing of what people type: the YAML config, CLI arguments and Rego.

Contract under test: a bad input is a domain error with a message (ConfigError,
PolicyError, exit code 1 or 2 with one line), never another exception or a traceback.
CI runs a few dozen examples each; `make reliability` runs hundreds.
"""

from __future__ import annotations

import io
import random
import shutil
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoscaler.config import parse_config
from autoscaler.errors import AutoscalerError, ConfigError
from autoscaler.policy.bundle import load_bundle, shipped_policy_dir
from autoscaler.policy.engines import EmbeddedEngine
from tests.conftest import TEST_CONFIG, free_port

CI = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
LONG = settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), database=None)

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=20))
yaml_values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12,
)
KEYS = [
    "deployment",
    "database_url",
    "server",
    "teams",
    "queues",
    "pools",
    "policy",
    "reconcile",
    "host",
    "port",
    "name",
    "provider",
    "max_instances",
    "min_instances",
    "instance_types",
    "capacity_types",
    "zones",
    "options",
    "interval_s",
    "tls_terminated_upstream",
    "simulated_gpus",
    "count",
    "gpus",
]


def _mutate(base: Any, data: st.DataObject) -> Any:
    """Replace one value somewhere in a valid config with a random one."""
    if isinstance(base, dict) and base and data.draw(st.booleans()):
        key = data.draw(st.sampled_from(sorted(base) + KEYS))
        copy = dict(base)
        copy[key] = _mutate(base[key], data) if key in base else data.draw(yaml_values)
        return copy
    if isinstance(base, list) and base and data.draw(st.booleans()):
        i = data.draw(st.integers(0, len(base) - 1))
        return [*base[:i], _mutate(base[i], data), *base[i + 1 :]]
    return data.draw(yaml_values)


def _config_case(data: st.DataObject) -> None:
    base = yaml.safe_load(TEST_CONFIG)
    text = data.draw(
        st.one_of(
            st.text(max_size=200),  # not even YAML, most of the time
            st.builds(lambda v: yaml.safe_dump(v), yaml_values),
            st.just(None).map(lambda _: yaml.safe_dump(_mutate(base, data))),
        )
    )
    try:
        parse_config(text, Path("fuzz.yaml"))
    except ConfigError as exc:
        assert exc.message.startswith("fuzz.yaml"), exc.message  # names the file
        assert "Traceback" not in exc.message


@given(data=st.data())
@CI
def test_config_loader_never_crashes(data: st.DataObject) -> None:
    _config_case(data)


@pytest.mark.slow
@pytest.mark.timeout(900)
@given(data=st.data())
@LONG
def test_config_loader_never_crashes_long(data: st.DataObject) -> None:
    _config_case(data)


# ---------------------------------------------------------------- CLI

SAFE_COMMANDS = [
    ["enqueue"],
    ["tasks"],
    ["logs"],
    ["cancel"],
    ["queues"],
    ["workers"],
    ["instances"],
    ["explain"],
    ["spend"],
    ["task"],
    ["token"],
    ["token", "create"],
    ["policy", "check"],
    ["policy", "eval"],
    ["policy", "test"],
    ["nonsense"],
]
WORDS = [
    "--queue",
    "--gpus",
    "--json",
    "--limit",
    "--state",
    "--team",
    "--token",
    "--month",
    "--format",
    "--join",
    "--pool",
    "--ttl",
    "--",
    "-1",
    "0",
    "1e999",
    "99999999999999999999",
    "../../etc",
    "gpu",
    "",
    " ",
    "é",
    "--help",
    "x" * 300,
    "--server",
]


def _run_cli(argv: list[str], monkeypatch: pytest.MonkeyPatch, dead_url: str) -> tuple[int, str]:
    from autoscaler.cli import main

    monkeypatch.setattr(sys, "argv", ["autoscaler", *argv])
    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code
    return (code if isinstance(code, int) else 1), out.getvalue() + err.getvalue()


def _cli_case(data: st.DataObject, monkeypatch: pytest.MonkeyPatch, dead_url: str) -> None:
    argv = data.draw(st.sampled_from(SAFE_COMMANDS)) + data.draw(
        st.lists(
            st.one_of(
                st.sampled_from(WORDS),
                st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12),
            ),
            max_size=6,
        )
    )
    code, output = _run_cli(argv, monkeypatch, dead_url)
    assert code in (0, 1, 2), (argv, code, output[-500:])
    assert "Traceback" not in output, (argv, output[-1500:])


@pytest.fixture
def dead_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: client commands must fail cleanly
    monkeypatch.setenv("AUTOSCALER_SERVER", url)
    monkeypatch.setenv("AUTOSCALER_TOKEN", "ast_fuzz")
    monkeypatch.setenv("AUTOSCALER_HOME", str(tmp_path))
    monkeypatch.delenv("AUTOSCALER_CONFIG", raising=False)
    return url


def test_cli_arguments_never_crash(dead_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    @given(data=st.data())
    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def run(data: st.DataObject) -> None:
        _cli_case(data, monkeypatch, dead_server)

    run()


# ---------------------------------------------------------------- Rego


def _mutations(source: str, rng: random.Random) -> str:
    tokens = [
        "{",
        "}",
        "[",
        "]",
        "(",
        ")",
        "if",
        "contains",
        "some",
        "every",
        "in",
        ":=",
        "=",
        "==",
        "not",
        "default",
        "import rego.v1",
        "package",
        '"',
        "input.",
        "data.",
        "with input as {}",
        "\n",
        "x",
        "count(",
        "sum([",
        "1e400",
        "null",
        "_",
    ]
    text = source
    for _ in range(rng.randint(1, 4)):
        i = rng.randint(0, len(text))
        if rng.random() < 0.5:
            text = text[:i] + rng.choice(tokens) + text[i:]
        else:
            text = text[:i] + text[i + rng.randint(1, 40) :]
    return text


def _rego_case(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    target = tmp_path / f"p{seed}"
    shutil.copytree(shipped_policy_dir(), target)
    victim = rng.choice(sorted(target.glob("*.rego")))
    victim.write_text(_mutations(victim.read_text(), rng))
    try:
        bundle = load_bundle(target, with_cases=False)
    except AutoscalerError:
        return
    # The server's engine: rego-cpp in a child process, so a crash there is a problem, not our death.
    engine = EmbeddedEngine(bundle, isolate=True)
    try:
        problems = engine.compile()
    except AutoscalerError:
        return
    finally:
        engine.close()
    for p in problems:
        assert str(p), "a problem without a message"


def test_mutated_rego_is_refused_or_compiles(tmp_path: Path) -> None:
    for seed in range(12):
        _rego_case(seed, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_mutated_rego_is_refused_or_compiles_long(tmp_path: Path) -> None:
    for seed in range(300):
        _rego_case(seed, tmp_path)
