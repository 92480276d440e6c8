"""What a benchmark records about the machine it ran on: the host, the device, the CPU's name,
package versions, the device's memory."""

from __future__ import annotations

import os
import platform
from importlib import metadata
from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    import torch

GIB = 1 << 30


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what ``platform`` says."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        return cpu


def package_version(name: str) -> str | None:
    """An installed distribution's version, or None when it is not installed."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def machine(device: torch.device) -> dict[str, Any]:
    """The host (Python, platform, CPUs, memory) and, on CUDA, the device the run measured."""
    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
        "host_memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        env.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / GIB, 1), sm_count=p.multi_processor_count,
                   cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    return env


def environment(device: torch.device, packages: Iterable[str]) -> dict[str, Any]:
    """``machine(device)``, the CPU's name and the versions of ``packages`` (None: not installed)."""
    return {**machine(device), "cpu": cpu_name(), "versions": {name: package_version(name) for name in packages}}


def device_memory(device: torch.device) -> dict[str, int]:
    """The device allocator's figures now and its high-water mark (nothing off CUDA)."""
    import torch

    if device.type != "cuda":
        return {}
    free, total = torch.cuda.mem_get_info(device)
    return {"allocated_bytes": torch.cuda.memory_allocated(device), "device_used_bytes": total - free,
            "device_free_bytes": free, "peak_allocated_bytes": torch.cuda.max_memory_allocated(device)}
