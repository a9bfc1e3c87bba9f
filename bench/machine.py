"""The machine a benchmark ran on, as its header prints it: CPU model, CPUs, OS."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("AMD EPYC"), else the architecture."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.machine()


def describe_host() -> str:
    return f"{cpu_model()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
