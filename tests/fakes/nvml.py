"""A scripted stand-in for the `pynvml` module (nvidia-ml-py), for machines without GPUs.

Two ways in:
- in-process: `install(script)` puts this module in `sys.modules["pynvml"]`;
- in an agent subprocess: `shadow_dir(tmp)` makes a directory holding `pynvml.py`
  (a link to this file) to put first on PYTHONPATH, and the env var `FAKE_NVML`
  names a JSON script. The script is re-read on every call, so a test can change
  it while the agent runs (e.g. a GPU falls off the bus).

Script: {"init_error": null | "LibraryNotFound" | "DriverNotLoaded",
         "driver": "550.54.15", "cuda": 12040,
         "gpus": [{"name", "uuid", "memory_total_mb", "memory_used_mb", "utilization",
                   "temperature", "error": null | "GpuIsLost"}]}
Only the functions the agent calls are provided; anything else raises
AttributeError, which is how a test learns the agent started using more of NVML.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

NVML_TEMPERATURE_GPU = 0
_override: dict[str, Any] | None = None
_initialised = False


class NVMLError(Exception):
    message = "Unknown Error"

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self.message


class NVMLError_LibraryNotFound(NVMLError):
    message = "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    message = "Driver Not Loaded"


class NVMLError_Uninitialized(NVMLError):
    message = "Uninitialized"


class NVMLError_GpuIsLost(NVMLError):
    message = "GPU is lost"


class NVMLError_InvalidArgument(NVMLError):
    message = "Invalid Argument"


_ERRORS = {
    "LibraryNotFound": NVMLError_LibraryNotFound,
    "DriverNotLoaded": NVMLError_DriverNotLoaded,
    "GpuIsLost": NVMLError_GpuIsLost,
}


def _script() -> dict[str, Any]:
    if _override is not None:
        return _override
    path = os.environ.get("FAKE_NVML")
    if not path:
        raise NVMLError_LibraryNotFound()
    data: dict[str, Any] = json.loads(Path(path).read_text())
    return data


def _gpu(handle: int) -> dict[str, Any]:
    if not _initialised:
        raise NVMLError_Uninitialized()
    gpus = _script().get("gpus", [])
    if not 0 <= handle < len(gpus):
        raise NVMLError_InvalidArgument()
    gpu: dict[str, Any] = gpus[handle]
    if gpu.get("error"):
        raise _ERRORS[gpu["error"]]()
    return gpu


def nvmlInit() -> None:
    global _initialised
    error = _script().get("init_error")
    if error:
        raise _ERRORS[error]()
    _initialised = True


def nvmlShutdown() -> None:
    global _initialised
    _initialised = False


def nvmlDeviceGetCount() -> int:
    if not _initialised:
        raise NVMLError_Uninitialized()
    return len(_script().get("gpus", []))


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    _gpu(index)
    return index


def nvmlDeviceGetName(handle: int) -> str:
    return str(_gpu(handle).get("name", "NVIDIA A10G"))


def nvmlDeviceGetUUID(handle: int) -> str:
    return str(_gpu(handle).get("uuid", f"GPU-fake-{handle}"))


def nvmlDeviceGetMemoryInfo(handle: int) -> SimpleNamespace:
    gpu = _gpu(handle)
    total = int(gpu.get("memory_total_mb", 24576)) * 1024 * 1024
    used = int(gpu.get("memory_used_mb", 0)) * 1024 * 1024
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(handle: int) -> SimpleNamespace:
    return SimpleNamespace(gpu=int(_gpu(handle).get("utilization", 0)), memory=0)


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return int(_gpu(handle).get("temperature", 40))


def nvmlSystemGetDriverVersion() -> str:
    return str(_script().get("driver", "550.54.15"))


def nvmlSystemGetCudaDriverVersion() -> int:
    return int(_script().get("cuda", 12040))


def gpus(count: int, name: str = "NVIDIA A10G", memory_mb: int = 24576) -> list[dict[str, Any]]:
    """A script's `gpus` list of `count` identical GPUs."""
    return [
        {
            "name": name,
            "uuid": f"GPU-{i:08d}-fake",
            "memory_total_mb": memory_mb,
            "memory_used_mb": 100 * i,
            "utilization": 10 * i,
            "temperature": 40 + i,
        }
        for i in range(count)
    ]


def install(script: dict[str, Any]) -> ModuleType:
    """Make `import pynvml` in this process return this module, scripted by `script`."""
    global _override, _initialised
    _override = script
    _initialised = False
    module = sys.modules[__name__]
    sys.modules["pynvml"] = module
    return module


def shadow_dir(directory: Path) -> Path:
    """A directory to put first on PYTHONPATH so a subprocess imports this fake as `pynvml`."""
    directory.mkdir(parents=True, exist_ok=True)
    link = directory / "pynvml.py"
    if not link.exists():
        link.symlink_to(Path(__file__).resolve())
    return directory
