"""Facts about this machine that registration reports: hostname, private address, CPUs, memory."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def hostname() -> str:
    return socket.gethostname() or "unknown"


def private_address(provider: str, environ: Mapping[str, str] | None = None) -> str:
    """The address other machines of the pool reach this one at (a gang's rank 0 is its
    MASTER_ADDR). AUTOSCALER_ADDRESS wins; a local pool's machines are all this host;
    otherwise the source address of the default route (a UDP socket is only pointed at a
    documentation address, no packet is sent), else the loopback."""
    env = os.environ if environ is None else environ
    given = env.get("AUTOSCALER_ADDRESS", "").strip()
    if given:
        return given
    if provider == "local":
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: never routed to anyone
            return str(s.getsockname()[0])
    except OSError:
        return "127.0.0.1"


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 0


def memory_mb() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024))
    except (ValueError, OSError, AttributeError):
        return 0
