"""The agent image's install script, run for real in a Debian container.

A Debian bookworm root filesystem made with debootstrap (scripts/ensure-podman.sh,
cached between sessions) is imported into podman once per session; the container
gets what Packer would upload (units, exit and guard scripts, a wheel of this
checkout and a wheelhouse of its dependencies, so pip needs no network) and runs
`agent_image/scripts/install-agent.sh`. The checks then look at what it left: the
agent and its CLI, the units and their enablement, the unprivileged task user, the
private /etc/autoscaler; and the metadata guard's iptables rules do keep the task
user (but not root) away from 169.254.169.254, a listener on the container's own
loopback standing in for the cloud's metadata service.

podman runs with `--runtime runc` (crun refuses hybrid cgroup layouts) and a
containers.conf without default ulimits (see docs/agent.md, "Testing the install script").
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.conftest import AGENT_IMAGE, REPO

IMAGE = "localhost/autoscaler-test-debian:bookworm"
CACHE = Path(os.environ.get("AUTOSCALER_TEST_CACHE") or Path.home() / ".cache" / "gpu-autoscaler-tests")
TARBALL = CACHE / "debian-bookworm-agent-rootfs.tar"
ENSURE = REPO / "scripts" / "ensure-podman.sh"

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="podman containers with debootstrap rootfs need root here"),
    pytest.mark.timeout(1200),
]

CHECKS = r"""
set -u
cp -r /mnt/staging /tmp/autoscaler-agent
bash /mnt/install-agent.sh > /tmp/install.log 2>&1
echo "install_rc=$?"
tail -n 30 /tmp/install.log | sed 's/^/install: /'
echo "passwd=$(getent passwd autoscaler-task)"
echo "etc_mode=$(stat -c %a /etc/autoscaler)"
echo "agent_help=$(/usr/local/bin/autoscaler agent --help >/dev/null 2>&1 && echo ok)"
echo "probe=$(/opt/autoscaler-agent/bin/autoscaler agent --probe | python3 -c 'import json,sys; print(json.load(sys.stdin)["source"][:40])')"
for f in /etc/systemd/system/autoscaler-agent.service /etc/systemd/system/autoscaler-imds-guard.service \
         /usr/local/libexec/autoscaler/autoscaler-agent-exit /usr/local/libexec/autoscaler/autoscaler-imds-guard \
         /etc/systemd/system/multi-user.target.wants/autoscaler-agent.service \
         /etc/systemd/system/multi-user.target.wants/autoscaler-imds-guard.service \
         /etc/systemd/system/autoscaler-agent.service.requires/autoscaler-imds-guard.service; do
  if [ -e "$f" ]; then echo "present=$f"; else echo "missing=$f"; fi
done
echo "unit_sha=$(sha256sum /etc/systemd/system/autoscaler-agent.service | cut -d' ' -f1)"
echo "staging_left=$(test -e /tmp/autoscaler-agent && echo yes || echo no)"
# The guard, and a stand-in metadata service on this container's own loopback.
/usr/local/libexec/autoscaler/autoscaler-imds-guard 2>&1 | sed 's/^/guard: /'
/usr/local/libexec/autoscaler/autoscaler-imds-guard >/dev/null 2>&1  # twice: idempotent
echo "rules=$(iptables -S OUTPUT | grep -c autoscaler-imds-guard)"
echo "forward_rules=$(iptables -S FORWARD | grep -c autoscaler-imds-guard) $(iptables -S DOCKER-USER | grep -c autoscaler-imds-guard) $(iptables -S FORWARD | grep -c -- '-j DOCKER-USER')"
ip addr add 169.254.169.254/32 dev lo
python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("169.254.169.254", 80)); s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"user-data"); c.close()
' > /tmp/imds.log 2>&1 &
for i in 1 2 3 4 5 6 7 8 9 10; do grep -q listening /tmp/imds.log && break; sleep 0.2; done
PROBE='import socket
s = socket.create_connection(("169.254.169.254", 80), timeout=3)
print(s.recv(100).decode())'
echo "root_imds=$(python3 -c "$PROBE" 2>&1 | tail -n1)"
echo "task_imds=$(runuser -u autoscaler-task -- python3 -c "$PROBE" 2>&1 | tail -n1)"
"""


def _podman(*args: str, timeout: float = 600, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--runtime", "runc", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def podman_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed: run scripts/ensure-podman.sh (make test does)", pytrace=False)
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text("[containers]\ndefault_ulimits = []\n")
    os.environ["CONTAINERS_CONF"] = str(conf)
    if not TARBALL.is_file():
        done = subprocess.run(["bash", str(ENSURE)], capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0 or not TARBALL.is_file():
            pytest.skip(f"cannot build the Debian root filesystem with debootstrap: {done.stderr.strip()[-500:]}")
    if _podman("image", "exists", IMAGE).returncode != 0:
        imported = _podman("import", str(TARBALL), IMAGE)
        if imported.returncode != 0:
            pytest.skip(f"podman cannot import the root filesystem here: {imported.stderr.strip()[-500:]}")
    smoke = _podman("run", "--rm", "--network", "none", IMAGE, "true", timeout=120)
    if smoke.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {smoke.stderr.strip()[-500:]}")
    yield IMAGE


def _wheelhouse() -> Path:
    """This checkout's dependencies as wheels (cached by pyproject.toml's hash), so the
    install inside the container needs no network."""
    key = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()[:16]
    house = CACHE / f"wheels-{key}"
    if (house / ".complete").exists():
        return house
    tmp = CACHE / f"wheels-{key}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(tmp), f"{REPO}[gpu]"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot build the wheelhouse for the container install: {done.stderr.strip()[-500:]}")
    for own in tmp.glob("gpu_autoscaler-*.whl"):
        own.unlink()  # the checkout's own wheel is built fresh for each session
    (tmp / ".complete").touch()
    shutil.rmtree(house, ignore_errors=True)
    tmp.rename(house)
    return house


@pytest.fixture(scope="session")
def installed(podman_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    staging = tmp_path_factory.mktemp("staging")
    for name in ("autoscaler-agent.service", "autoscaler-agent-exit", "autoscaler-imds-guard",
                 "autoscaler-imds-guard.service"):  # fmt: skip
        shutil.copy2(AGENT_IMAGE / "files" / name, staging / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(staging), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    shutil.copytree(_wheelhouse(), staging / "wheels")
    res = _podman(
        "run", "--rm", "--network", "none", "--cap-add", "NET_ADMIN",
        "-v", f"{staging}:/mnt/staging:ro",
        "-v", f"{AGENT_IMAGE / 'scripts' / 'install-agent.sh'}:/mnt/install-agent.sh:ro",
        podman_image, "bash", "-c", CHECKS,
        timeout=900,
    )  # fmt: skip
    out: dict[str, list[str]] = {}
    for line in res.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out.setdefault(key, []).append(value)
    out["_raw"] = [res.stdout + res.stderr]
    return out


def test_install_script_installs_the_agent_and_its_units(installed: dict[str, list[str]]) -> None:
    raw = installed["_raw"][0]
    assert installed["install_rc"] == ["0"], raw
    assert installed["agent_help"] == ["ok"], raw
    assert installed["probe"] and installed["probe"][0], raw  # the agent runs inside the image
    assert "missing" not in installed, raw
    assert len(installed["present"]) == 7, raw
    unit = AGENT_IMAGE / "files" / "autoscaler-agent.service"
    assert installed["unit_sha"] == [hashlib.sha256(unit.read_bytes()).hexdigest()], raw
    assert installed["etc_mode"] == ["700"], raw
    assert installed["staging_left"] == ["no"], raw  # no build's files left in the image


def test_install_script_creates_the_unprivileged_task_user(installed: dict[str, list[str]]) -> None:
    (entry,) = installed["passwd"]
    name, _, uid, gid, _gecos, home, shell = entry.split(":")
    assert name == "autoscaler-task", installed["_raw"][0]
    assert 0 < int(uid) < 1000 and int(gid) > 0  # a system user, not root
    assert shell == "/usr/sbin/nologin" and home == "/nonexistent"


def test_metadata_guard_lets_only_the_agent_reach_imds(installed: dict[str, list[str]]) -> None:
    raw = installed["_raw"][0]
    assert installed["rules"] == ["3"], raw  # IMDS (tcp, other) + Azure WireServer, once each
    assert installed["forward_rules"] == ["1 1 1"], raw  # containers: FORWARD and DOCKER-USER, once each
    assert installed["root_imds"] == ["user-data"], raw  # the agent (root) still reaches it
    assert "refused" in installed["task_imds"][0].lower(), raw  # a task gets a REJECT
