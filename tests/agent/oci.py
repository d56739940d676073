"""A real OCI setup for container task tests: rootful podman with runc, Debian's
`docker-registry` on 127.0.0.1, and a busybox image built here and pushed to it.

Why each piece (see docs/agent.md, "Container tasks", and scripts/ensure-podman.sh):
crun refuses these machines' hybrid cgroup layout, so containers.conf picks runc;
default ulimits cannot be set here, so it clears them; nothing can be pulled from
the internet, so the image is a busybox-static root filesystem imported with
`podman import` and pushed to the local registry, which the agent pulls it back from.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

IMAGE_MARKER = "built-by-the-autoscaler-tests"
BUSYBOX_LINKS = ("sh", "sleep", "echo", "cat", "env", "id", "ls", "pwd", "true", "false", "mkdir", "mv", "stat")


@dataclass(frozen=True)
class Oci:
    registry: str  # host:port of the local registry
    image: str  # pushed there: busybox plus /image-marker
    conf_dir: Path
    env: dict[str, str]  # CONTAINERS_CONF / CONTAINERS_REGISTRIES_CONF for podman and the agent

    def podman(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["podman", *args], env={**os.environ, **self.env}, capture_output=True, text=True, timeout=60, check=check
        )

    def containers(self, name_prefix: str = "autoscaler-") -> list[str]:
        out = self.podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
        return [n for n in out if n.startswith(name_prefix)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def missing_tools() -> str | None:
    for tool in ("podman", "runc", "docker-registry"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed: run scripts/ensure-podman.sh (make test does)"
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", "busybox-static"], capture_output=True, text=True, check=False
    )
    if "install ok installed" not in status.stdout:
        return "busybox-static is not installed: run scripts/ensure-podman.sh (make test does)"
    return None


@contextlib.contextmanager
def oci_setup(root: Path) -> Iterator[Oci]:
    if os.geteuid() != 0:
        pytest.skip("container task tests run rootful podman: run them as root")
    why = missing_tools()
    if why:  # as in tests/deploy/test_install_agent.py: a missing tool is a failure, not a skip
        pytest.fail(why, pytrace=False)
    port = free_port()
    registry = f"127.0.0.1:{port}"
    conf = root / "conf"
    conf.mkdir(parents=True)
    (conf / "containers.conf").write_text('[containers]\ndefault_ulimits = []\n[engine]\nruntime = "runc"\n')
    (conf / "registries.conf").write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    (conf / "registry.yml").write_text(
        "version: 0.1\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root / 'registry-data'}\n"
        f"http:\n  addr: {registry}\n"
    )
    env = {
        "CONTAINERS_CONF": str(conf / "containers.conf"),
        "CONTAINERS_REGISTRIES_CONF": str(conf / "registries.conf"),
    }
    log = (root / "registry.log").open("wb")
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(conf / "registry.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    tag = secrets.token_hex(4)
    image = f"{registry}/autoscaler-test/busybox:{tag}"
    local = f"localhost/autoscaler-test-busybox:{tag}"
    oci = Oci(registry=registry, image=image, conf_dir=conf, env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://{registry}/v2/", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"the registry did not come up: {(root / 'registry.log').read_text()}")
            time.sleep(0.1)
        rootfs = root / "rootfs"
        (rootfs / "bin").mkdir(parents=True)
        (rootfs / "tmp").mkdir()
        (rootfs / "tmp").chmod(0o1777)  # after mkdir: the umask would drop the write bits
        shutil.copy2("/bin/busybox", rootfs / "bin" / "busybox")
        for name in BUSYBOX_LINKS:
            (rootfs / "bin" / name).symlink_to("busybox")
        (rootfs / "image-marker").write_text(IMAGE_MARKER + "\n")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(root / "rootfs.tar"), "."], check=True)
        oci.podman("import", str(root / "rootfs.tar"), local)
        oci.podman("push", local, image)
        oci.podman("rmi", local)  # the agent must pull it from the registry
        yield oci
    finally:
        for name in oci.containers():
            oci.podman("rm", "--force", "--ignore", name, check=False)
        oci.podman("rmi", "--ignore", "--force", image, local, check=False)
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(10)
        if proc.poll() is None:
            proc.kill()
        log.close()


@contextlib.contextmanager
def fake_cdi_gpus(count: int) -> Iterator[str]:
    """A CDI spec for `nvidia.com/gpu` whose device N only sets FAKE_GPU_N=present in
    the container: with it the agent's real CDI path runs without a GPU, and a task
    shows which devices the engine handed it. Podman 4.3 reads only /etc/cdi and
    /var/run/cdi, so the spec is written there and removed after the test."""
    from autoscaler.agent.container import nvidia_cdi_present

    if nvidia_cdi_present():
        pytest.skip("this machine has a real NVIDIA CDI spec; the fake one would clash with it")
    cdi = Path("/var/run/cdi")
    try:
        cdi.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        pytest.skip(f"cannot write a CDI spec in {cdi}: {exc}")
    path = cdi / f"autoscaler-test-{secrets.token_hex(4)}.yaml"
    devices = "".join(f'- name: "{i}"\n  containerEdits:\n    env: ["FAKE_GPU_{i}=present"]\n' for i in range(count))
    path.write_text(f'cdiVersion: "0.5.0"\nkind: nvidia.com/gpu\ndevices:\n{devices}')
    try:
        yield str(path)
    finally:
        path.unlink(missing_ok=True)
