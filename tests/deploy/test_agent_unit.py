"""The agent's systemd unit and its power-off-after-drain hook.

The hook is run for real with systemd's environment variables and a stand-in
`systemctl` first on PATH that records what it was asked and answers the queries.
"""

from __future__ import annotations

import configparser
import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import AGENT_IMAGE

UNIT = AGENT_IMAGE / "files" / "autoscaler-agent.service"
HOOK = AGENT_IMAGE / "files" / "autoscaler-agent-exit"


def _unit() -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(UNIT.read_text())
    return cp


def test_unit_restarts_on_failure_and_powers_off_through_the_hook() -> None:
    svc = _unit()["Service"]
    assert svc["Restart"] == "on-failure"  # exit 0 (drained) is not restarted
    assert svc["ExecStart"].split()[1:] == ["agent", "--bootstrap", "/etc/autoscaler/agent.json"]
    install = (AGENT_IMAGE / "scripts" / "install-agent.sh").read_text()
    assert svc["ExecStopPost"] in install  # installed where the unit looks for it
    assert svc["ExecStart"].split()[0].startswith("/opt/autoscaler-agent/bin/")
    assert _unit()["Unit"]["ConditionPathExists"] == "/etc/autoscaler/agent.json"
    assert _unit()["Install"]["WantedBy"] == "multi-user.target"


def test_stop_signals_only_the_agent_which_drains_within_the_stop_timeout() -> None:
    from autoscaler.agent.settings import Timing

    svc = _unit()["Service"]
    # mixed: SIGTERM to the main process only (the agent drains, then signals its tasks
    # itself); SIGKILL to the whole cgroup only when TimeoutStopSec runs out.
    assert svc["KillMode"] == "mixed"
    assert svc["KillSignal"] == "SIGTERM"
    # The agent's own deadline must end before systemd's, or tasks are killed undrained.
    timing = Timing()
    assert float(svc["TimeoutStopSec"]) > timing.drain_deadline_s + timing.kill_grace_s


def test_unit_lets_the_agent_drop_its_join_token_and_keeps_its_state_private() -> None:
    svc = _unit()["Service"]
    # ProtectSystem=full makes /etc read-only: the agent rewrites its bootstrap file
    # there once, to remove the join token after joining.
    assert svc["ProtectSystem"] == "full" and svc["ReadWritePaths"] == "/etc/autoscaler"
    assert svc["StateDirectory"] == "autoscaler-agent" and svc["StateDirectoryMode"] == "0700"
    assert "User" not in svc  # root, so it can run tasks as the unprivileged task user
    assert "autoscaler-imds-guard.service" in _unit()["Unit"]["After"]
    guard = configparser.ConfigParser(strict=False, interpolation=None)
    guard.read_string((AGENT_IMAGE / "files" / "autoscaler-imds-guard.service").read_text())
    assert guard["Install"]["RequiredBy"] == "autoscaler-agent.service"  # no guard, no agent
    assert guard["Service"]["ExecStart"] in (AGENT_IMAGE / "scripts" / "install-agent.sh").read_text()


@pytest.fixture
def fake_systemctl(tmp_path: Path) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "systemctl"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@" >> "$FAKE_LOG"\n'
        'case "$1" in\n'
        '  is-system-running) echo "${FAKE_STATE:-running}" ;;\n'
        '  list-jobs) printf "%s" "${FAKE_JOBS:-}" ;;\n'
        "esac\n"
    )
    script.chmod(0o755)
    return bindir


def _hook(bindir: Path, tmp_path: Path, **env: str) -> list[str]:
    log = tmp_path / "calls"
    log.write_text("")
    full = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_LOG=str(log), **env)
    res = subprocess.run(["sh", str(HOOK)], env=full, capture_output=True, text=True, timeout=10, check=False)
    assert res.returncode == 0, res.stderr
    return log.read_text().splitlines()


DRAINED = {"SERVICE_RESULT": "success", "EXIT_CODE": "exited", "EXIT_STATUS": "0"}


def test_finished_drain_powers_off(fake_systemctl: Path, tmp_path: Path) -> None:
    assert "poweroff --no-block" in _hook(fake_systemctl, tmp_path, **DRAINED)


@pytest.mark.parametrize(
    "env",
    [
        {"SERVICE_RESULT": "exit-code", "EXIT_CODE": "exited", "EXIT_STATUS": "1"},  # crash: restart instead
        {"SERVICE_RESULT": "success", "EXIT_CODE": "killed", "EXIT_STATUS": "TERM"},  # stopped by a signal
        {"SERVICE_RESULT": "signal", "EXIT_CODE": "killed", "EXIT_STATUS": "KILL"},
    ],
)
def test_other_exits_leave_the_machine_up(fake_systemctl: Path, tmp_path: Path, env: dict[str, str]) -> None:
    assert not any("poweroff" in c for c in _hook(fake_systemctl, tmp_path, **env))


def test_requested_stop_does_not_power_off(fake_systemctl: Path, tmp_path: Path) -> None:
    jobs = "1234 autoscaler-agent.service stop running\n"
    calls = _hook(fake_systemctl, tmp_path, FAKE_JOBS=jobs, **DRAINED)
    assert not any("poweroff" in c for c in calls)


def test_shutdown_in_progress_does_not_power_off_again(fake_systemctl: Path, tmp_path: Path) -> None:
    calls = _hook(fake_systemctl, tmp_path, FAKE_STATE="stopping", **DRAINED)
    assert not any("poweroff" in c for c in calls)


def test_another_units_stop_job_does_not_block_power_off(fake_systemctl: Path, tmp_path: Path) -> None:
    jobs = "77 autoscaler-agent-helper.service stop running\n"
    assert "poweroff --no-block" in _hook(fake_systemctl, tmp_path, FAKE_JOBS=jobs, **DRAINED)
