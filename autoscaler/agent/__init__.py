"""The agent: the process on each GPU machine that registers with the control plane,
leases tasks, runs them pinned to their GPUs, reports GPU use, and drains before
scale-down or on a spot notice. It talks HTTP only and imports no server code
(no SQLAlchemy, no FastAPI), so a VM image needs httpx, pydantic and, for real
GPUs, nvidia-ml-py. Started by `autoscaler agent`; see docs/agent.md.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from autoscaler.agent.settings import AgentSettings, SimulatedGpuSpec


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s agent %(levelname)s %(message)s",
    )
    # One line per HTTP call would drown what matters; failures are logged by the agent.
    logging.getLogger("httpx").setLevel(logging.WARNING)


def run(settings: AgentSettings, *, max_tasks: int | None = None, log_level: str = "info") -> int:
    """Run the agent until it drains, is preempted or is told it is gone; the exit code."""
    from autoscaler.agent.gpus import discover
    from autoscaler.agent.loop import Agent
    from autoscaler.agent.metadata import metadata_service
    from autoscaler.agent.server_api import ServerApi

    _configure_logging(log_level)
    log = logging.getLogger("autoscaler.agent")
    for key in settings.ignored_keys:
        log.warning("bootstrap file: ignoring unknown key %r", key)
    for warning in settings.warnings:
        log.warning("%s", warning)
    api = ServerApi(settings.server_url, settings.timing.request_timeout_s)
    agent = Agent(
        settings,
        api,
        discover(settings.simulated_gpus),
        metadata_service(settings.provider, settings.metadata_url),
        max_tasks=max_tasks,
    )
    return agent.run()


def probe(simulated: SimulatedGpuSpec | None = None) -> dict[str, Any]:
    """What registration and one heartbeat would report about the GPUs, as JSON data."""
    from autoscaler.agent import host
    from autoscaler.agent.gpus import discover

    gpus = discover(simulated)
    return {
        "source": gpus.description,
        "hostname": host.hostname(),
        "cpus": host.cpu_count(),
        "memory_mb": host.memory_mb(),
        "gpus": [g.model_dump() for g in gpus.inventory()],
        "metrics": [m.model_dump() for m in gpus.sample()],
    }


def probe_json(simulated: SimulatedGpuSpec | None = None) -> str:
    return json.dumps(probe(simulated), indent=2)
