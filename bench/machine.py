"""What a benchmark records about the machine it ran on: the CPU's name, package versions."""

from __future__ import annotations

import platform
from importlib import metadata


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
