"""GPU inventory and utilisation, from NVML (`pynvml`, package nvidia-ml-py).

All NVML access of the agent goes through this module, so tests can shadow the
`pynvml` module with a scripted fake and keep everything else real. Without a
driver the agent has no GPUs, unless the bootstrap file asks for a simulated
inventory (local runs); simulated GPUs are labelled as such everywhere.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from autoscaler.agent.errors import AgentError
from autoscaler.agent.settings import SimulatedGpuSpec
from autoscaler.agent.wire import GpuInfo, GpuMetric

log = logging.getLogger("autoscaler.agent")
MIB = 1024 * 1024


class GpuSource(Protocol):
    description: str

    def inventory(self) -> list[GpuInfo]: ...

    def sample(self) -> list[GpuMetric]: ...


def _text(value: Any) -> str:
    # Older nvidia-ml-py versions return bytes, newer ones str.
    return value.decode() if isinstance(value, bytes) else str(value)


def _cuda_version(raw: int) -> str:
    # NVML encodes CUDA 12.4 as 12040.
    return f"{raw // 1000}.{(raw % 1000) // 10}"


@dataclass
class NoGpus:
    description: str

    def inventory(self) -> list[GpuInfo]:
        return []

    def sample(self) -> list[GpuMetric]:
        return []


@dataclass
class SimulatedGpus:
    spec: SimulatedGpuSpec
    description: str = "simulated"

    def inventory(self) -> list[GpuInfo]:
        return [
            GpuInfo(index=i, uuid=f"SIM-{i}", model=self.spec.model, memory_mb=self.spec.memory_mb, simulated=True)
            for i in range(self.spec.count)
        ]

    def sample(self) -> list[GpuMetric]:
        return [GpuMetric(index=i, memory_total_mb=self.spec.memory_mb) for i in range(self.spec.count)]


class NvmlGpus:
    """Real GPUs through NVML; errors on one GPU (e.g. GPU lost) are reported, not raised."""

    def __init__(self, nvml: ModuleType, count: int) -> None:
        self._nvml = nvml
        self._count = count
        self.description = "nvml"

    def inventory(self) -> list[GpuInfo]:
        nv = self._nvml
        driver = _text(nv.nvmlSystemGetDriverVersion())
        try:
            cuda: str | None = _cuda_version(int(nv.nvmlSystemGetCudaDriverVersion()))
        except nv.NVMLError:
            cuda = None
        gpus = []
        for i in range(self._count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                gpus.append(
                    GpuInfo(
                        index=i,
                        uuid=_text(nv.nvmlDeviceGetUUID(handle)),
                        model=_text(nv.nvmlDeviceGetName(handle)),
                        memory_mb=int(nv.nvmlDeviceGetMemoryInfo(handle).total // MIB),
                        driver_version=driver,
                        cuda_version=cuda,
                    )
                )
            except nv.NVMLError as exc:
                # Registering with a GPU missing would shift every index the server hands
                # out; a machine in this state needs a person (or a replacement), not work.
                raise AgentError(f"GPU {i} does not answer NVML ({exc}); not registering this machine") from None
        return gpus

    def sample(self) -> list[GpuMetric]:
        nv = self._nvml
        metrics = []
        for i in range(self._count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
                util = nv.nvmlDeviceGetUtilizationRates(handle)
                mem = nv.nvmlDeviceGetMemoryInfo(handle)
                try:
                    temp: float | None = float(nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU))
                except nv.NVMLError:
                    temp = None
                metrics.append(
                    GpuMetric(
                        index=i,
                        utilization_pct=float(util.gpu),
                        memory_used_mb=round(mem.used / MIB, 1),
                        memory_total_mb=round(mem.total / MIB, 1),
                        temperature_c=temp,
                    )
                )
            except nv.NVMLError as exc:
                # A lost or fallen-off GPU must show up on the dashboard, not crash the agent.
                metrics.append(GpuMetric(index=i, error=str(exc)[:256] or exc.__class__.__name__))
        return metrics


def discover(simulated: SimulatedGpuSpec | None = None) -> GpuSource:
    """NVML if a driver answers; else the simulated inventory if configured; else none."""
    try:
        import pynvml
    except ImportError:
        reason = "nvidia-ml-py is not installed (pip install 'gpu-autoscaler[gpu]')"
        return _fallback(simulated, reason)
    try:
        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as exc:
        return _fallback(simulated, f"NVML unavailable: {exc}")
    if count == 0:
        return _fallback(simulated, "NVML reports no GPUs")
    return NvmlGpus(pynvml, count)


def _fallback(simulated: SimulatedGpuSpec | None, reason: str) -> GpuSource:
    if simulated is not None and simulated.count > 0:
        log.info("%s; using %d simulated GPUs as the bootstrap file asks", reason, simulated.count)
        return SimulatedGpus(simulated, description=f"simulated ({reason})")
    return NoGpus(description=f"no GPUs ({reason})")
