"""Timing and device facts shared by the kernel benchmarks.

On CUDA: CUDA events around many launches, the median of several samples, and the
device's nominal memory bandwidth beside a measured device-to-device copy. Off the GPU
(`--smoke`, the Triton interpreter) wall-clock time, which only shows the script runs.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

# Vendor figures, bytes/s, matched against `torch.cuda.get_device_name()`.
NOMINAL_BANDWIDTH = (
    ("H200", 4.8e12),
    ("H100 NVL", 3.9e12),
    ("H100 PCIe", 2.0e12),
    ("H100", 3.35e12),  # SXM, HBM3
    ("A100-SXM4-80GB", 2.039e12),
    ("A100", 1.555e12),
)


def describe(device: torch.device) -> str:
    host = f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs"
    if device.type != "cuda":
        return f"{host}, CPU only (TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')})"
    props = torch.cuda.get_device_properties(device)
    return (
        f"{host}; {props.name}, {props.multi_processor_count} SMs, "
        f"{props.total_memory / 2**30:.0f} GiB; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}"
    )


def print_header(smoke: bool) -> tuple[torch.device, float | None]:
    """The device to run on (the CPU for `--smoke`), printed with the command and machine,
    and its nominal bandwidth (None off the GPU), printed beside a measured copy."""
    device = torch.device("cuda" if torch.cuda.is_available() and not smoke else "cpu")
    print(f"command: {' '.join(sys.argv)}")
    print(f"machine: {describe(device)}")
    peak = nominal_bandwidth(device)
    if device.type == "cuda":
        copy = copy_bandwidth(device)
        nominal = f"{peak / 1e12:.2f} TB/s" if peak else "unknown"
        print(f"bandwidth: nominal {nominal}, measured copy {copy / 1e12:.2f} TB/s")
    return device, peak


def nominal_bandwidth(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((bw for key, bw in NOMINAL_BANDWIDTH if key in name), None)


def copy_bandwidth(device: torch.device, num_bytes: int = 1 << 30) -> float:
    """Bytes moved per second (read plus write) by a device-to-device copy."""
    src = torch.randint(0, 255, (num_bytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device)
    return 2 * num_bytes / (ms * 1e-3)


def time_ms(
    fn: Callable[[], object], device: torch.device, repeat: int = 20, *, capture: bool = True
) -> float:
    """Median milliseconds of one call, after a warm-up call.

    On CUDA with `capture`, ten calls are captured in a CUDA graph and replayed, so Python's
    launch overhead is not counted: a kernel's own time. Without it, each call is timed
    between events on its own, host work and launches included: a step's real latency.
    """
    fn()
    if device.type != "cuda":
        return _median_ms(fn, max(1, repeat // 10), _wall_clock)
    torch.cuda.synchronize(device)
    if not capture:
        return _median_ms(fn, repeat, _cuda_events)
    inner = 10
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return _median_ms(graph.replay, repeat, _cuda_events) / inner


def _median_ms(fn: Callable[[], object], repeat: int, clock) -> float:
    return statistics.median(clock(fn) for _ in range(repeat))


def _wall_clock(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def _cuda_events(fn: Callable[[], object]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)
