"""A real single-node Slurm cluster (Debian's slurmctld/slurmd + munge) for tests.

Everything lives in one temp directory: the munge key and socket, slurm.conf and
gres.conf, state, spool, logs and two fake GPUs (symlinks to /dev/null, which Slurm
accepts as GPU device files). Nothing is written under /etc and no systemd is needed.
The ports are free loopback ports, so several clusters may coexist on one machine.

Start once per test session (about a second); `stop()` ends the daemons by PID and any
job process left behind (found by its environment naming our slurm.conf), because
`slurmstepd` can outlive `slurmd` and `proctrack/linuxproc` can leak job children.
The packages are installed by `make test` (scripts/ensure-slurm.sh); a missing binary
is reported as a harness failure, never a skip.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scancel", "munged", "mungekey", "munge", "unmunge")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    """PID 1 here reaps slowly, so a zombie counts as gone (state Z in /proc/PID/stat)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class SlurmCluster:
    def __init__(self, root: Path, *, gpus: int = 2, cpus: int = 4) -> None:
        self.root = root
        self.gpus = gpus
        self.cpus = cpus
        self.host = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.munge_socket = root / "munge" / "munge.sock"
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def env(self) -> dict[str, str]:
        """The environment a client (sbatch, squeue, scancel) needs to reach this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> SlurmCluster:
        missing = [b for b in BINARIES if shutil.which(b) is None]
        if missing:
            raise RuntimeError(f"Slurm/munge binaries missing: {missing}; run scripts/ensure-slurm.sh (make test does)")
        r = self.root
        for d in ("munge", "state", "spool", "log", "dev", "run"):
            (r / d).mkdir(parents=True, exist_ok=True)
        # munged refuses a socket directory that is not world-traversable.
        os.chmod(r, 0o755)
        os.chmod(r / "munge", 0o755)
        key = r / "munge" / "munge.key"
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
        self._spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--key-file={key}",
                f"--socket={self.munge_socket}",
                f"--pid-file={r / 'munge' / 'munged.pid'}",
                f"--seed-file={r / 'munge' / 'seed'}",
                f"--log-file={r / 'log' / 'munged.log'}",
            ],
        )
        self._wait_for(lambda: self.munge_socket.exists(), "munged socket")
        for i in range(self.gpus):
            (r / "dev" / f"gpu{i}").symlink_to("/dev/null")
        user = getpass.getuser()
        ctl_port, d_port = _free_port(), _free_port()
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=autoscaler-test",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={ctl_port}",
                    f"SlurmdPort={d_port}",
                    f"SlurmUser={user}",
                    f"SlurmdUser={user}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'run' / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core",
                    "MailProg=/bin/true",
                    "ReturnToService=2",
                    # Without these every job waits ~3 s for the scheduler.
                    "SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,bf_interval=1",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/filetxt",
                    f"JobCompLoc={r / 'log' / 'jobcomp.txt'}",
                    "KillWait=5",
                    "GresTypes=gpu",
                    "SlurmdParameters=config_overrides",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory=4000 "
                    f"Gres=gpu:{self.gpus} State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES State=UP MaxTime=INFINITE",
                    "",
                ]
            )
        )
        last = self.gpus - 1
        (r / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={self.host} Name=gpu File={r / 'dev'}/gpu[0-{last}]\n"
            if self.gpus > 1
            else f"AutoDetect=off\nNodeName={self.host} Name=gpu File={r / 'dev'}/gpu0\n"
        )
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self._wait_for(lambda: self._ok(["squeue", "--noheader"]), "slurmctld")
        self._spawn("slurmd", ["slurmd", "-D", "-f", str(self.conf)])
        self._wait_for(self._node_ready, "slurmd to register an idle node", timeout=30)
        return self

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self._procs.pop(name, None)
            if proc is None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._kill_leftovers()

    def run(self, *args: str) -> str:
        out = subprocess.run(list(args), env=self.env, check=True, capture_output=True, text=True, timeout=30)
        return out.stdout

    def log_tail(self, name: str = "slurmctld", lines: int = 30) -> str:
        path = self.root / "log" / f"{name}.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""

    # ---- internals -----------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115 - owned by the process
        self._procs[name] = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _ok(self, argv: list[str]) -> bool:
        return subprocess.run(argv, env=self.env, capture_output=True, timeout=10).returncode == 0

    def _node_ready(self) -> bool:
        out = subprocess.run(
            ["sinfo", "--noheader", "-o", "%t"], env=self.env, capture_output=True, text=True, timeout=10
        )
        return out.returncode == 0 and out.stdout.strip() in ("idle", "mix", "alloc")

    def _wait_for(self, check: object, what: str, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({proc.returncode}) while waiting for {what}:\n{self.log_tail(name)}"
                    )
            if check():  # type: ignore[operator]
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.log_tail('slurmctld')}\n{self.log_tail('slurmd')}")

    def _kill_leftovers(self) -> None:
        """Job processes (and stray slurmstepd) whose environment names our slurm.conf."""
        marker = f"SLURM_CONF={self.conf}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                environ = (entry / "environ").read_bytes()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in environ or str(self.conf).encode() in cmdline:
                with contextlib.suppress(OSError):
                    os.kill(int(entry.name), signal.SIGKILL)
