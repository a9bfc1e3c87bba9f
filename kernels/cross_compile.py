"""Cross-compilation of the Triton kernels for a CUDA GPU, on a machine without one.

Inside `with cross_compile(90) as builds:` Triton's active driver is one that targets
`sm_90` and launches nothing. The launchers run unchanged on CPU tensors; Triton compiles
each kernel for real (Triton IR, LLVM IR, PTX, then the `ptxas` it ships to a cubin), and
each launch appends a `KernelBuild` to `builds`: the kernel, its grid and warps, and the
registers, stack (where spills go) and shared memory of the cubin, read with the
`cuobjdump` Triton ships. Triton's own load-time checks run as on a GPU (shared memory
against the architecture's limit, warps against the threads the registers allow), so a
kernel that could not be launched there fails here with the same `OutOfResources`.

The kernels must have been defined without TRITON_INTERPRET: under the interpreter a
launch runs the kernel on the CPU instead of compiling it.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from triton import knobs
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver

_RESOURCES = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)")
_WARP = 32
_REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
_REGISTERS_PER_SM = 65536
_MAX_THREADS_PER_BLOCK = 1024
_MAX_BLOCKS_PER_SM = 32


@dataclass(frozen=True)
class CudaArch:
    """The limits of one compute capability that decide whether and how densely a kernel
    runs (CUDA C Programming Guide, "Compute Capabilities")."""

    sm: int
    name: str  # a representative part
    shared_per_block: int  # bytes of dynamic shared memory one block may opt into
    shared_per_sm: int  # bytes; each resident block also reserves 1 KiB
    max_warps_per_sm: int
    num_sms: int  # of the representative part


CUDA_ARCHS = {
    80: CudaArch(80, "A100", 166_912, 167_936, 64, 108),
    89: CudaArch(89, "L40S", 101_376, 102_400, 48, 142),
    90: CudaArch(90, "H100/H200", 232_448, 233_472, 64, 132),
    100: CudaArch(100, "B200", 232_448, 233_472, 64, 148),
}


@dataclass(frozen=True)
class KernelBuild:
    """One launch of a cross-compiled kernel."""

    name: str
    arch: int
    grid: tuple[int, int, int]
    num_warps: int
    num_stages: int
    registers: int  # per thread
    stack_bytes: int  # per thread: spilled registers and local arrays
    local_bytes: int  # per thread
    shared_bytes: int  # per block, dynamic
    fp_fusion: bool  # multiplies and adds fused into FMAs

    @property
    def spilled(self) -> bool:
        return self.stack_bytes > 0 or self.local_bytes > 0

    @property
    def max_threads(self) -> int:
        """Threads per block the registers allow (what `cuFuncGetAttribute` reports)."""
        return _max_threads(self.registers)

    def blocks_per_sm(self) -> int:
        """Resident blocks per multiprocessor, the least of the warp, register and shared
        memory limits (the CUDA occupancy calculator's rule)."""
        arch = CUDA_ARCHS[self.arch]
        limits = [
            _MAX_BLOCKS_PER_SM,
            arch.max_warps_per_sm // self.num_warps,
            _warps_by_registers(self.registers) // self.num_warps,
        ]
        if self.shared_bytes:
            limits.append(arch.shared_per_sm // (self.shared_bytes + 1024))
        return min(limits)


def _warps_by_registers(registers: int) -> int:
    per_warp = -(-registers * _WARP // _REGISTER_UNIT) * _REGISTER_UNIT
    return _REGISTERS_PER_SM // max(per_warp, 1)


def _max_threads(registers: int) -> int:
    return min(_MAX_THREADS_PER_BLOCK, _warps_by_registers(registers) * _WARP)


@contextmanager
def cross_compile(arch: int = 90) -> Iterator[list[KernelBuild]]:
    """Compile every Triton launch inside the block for `sm_<arch>`, run none of them, and
    collect their builds. Restores the previous driver on exit."""
    if arch not in CUDA_ARCHS:
        raise ValueError(f"unknown CUDA architecture {arch}; known: {sorted(CUDA_ARCHS)}")
    if knobs.runtime.interpret:
        raise RuntimeError(
            "cross_compile needs kernels compiled, not interpreted: unset TRITON_INTERPRET"
        )
    # Saved and restored as is: `driver.reset_active()` would create the default (CUDA)
    # driver, which fails on a machine without a GPU.
    previous = driver._active
    compile_only = _CompileOnlyDriver(CUDA_ARCHS[arch])
    driver.set_active(compile_only)
    try:
        yield compile_only.builds
    finally:
        driver._active = previous


@dataclass(frozen=True)
class _Cubin:
    """What `load_binary` hands Triton as the kernel's function handle."""

    registers: int
    stack_bytes: int
    local_bytes: int


class _Utils:
    def __init__(self, arch: CudaArch) -> None:
        self.arch = arch

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": self.arch.shared_per_block}

    def load_binary(
        self, name: str, cubin: bytes, shared: int, device: int
    ) -> tuple[None, _Cubin, int, int, int]:
        """(module, function, registers, spills, max threads), as the CUDA driver's. No
        module: Triton then never asks to unload one."""
        usage = _resource_usage(cubin)
        return None, usage, usage.registers, usage.stack_bytes, _max_threads(usage.registers)

    def unload_module(self, module: object) -> None:
        pass


def _resource_usage(cubin: bytes) -> _Cubin:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        report = subprocess.run(
            [knobs.nvidia.cuobjdump.path, "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    match = _RESOURCES.search(report)
    if match is None:
        raise RuntimeError(f"no resource usage in cuobjdump's report:\n{report}")
    return _Cubin(*(int(g) for g in match.groups()))


class _Launcher:
    """Stands where Triton's CUDA launcher would: records the launch instead."""

    def __init__(self, src: object, metadata: object) -> None:
        self.metadata = metadata

    def __call__(
        self, grid_x: int, grid_y: int, grid_z: int, stream: int, function: _Cubin, *_: object
    ) -> None:
        active = driver.active
        assert isinstance(active, _CompileOnlyDriver), "launch outside cross_compile"
        m = self.metadata
        active.builds.append(
            KernelBuild(
                name=m.name,
                arch=active.arch.sm,
                grid=(grid_x, grid_y, grid_z),
                num_warps=m.num_warps,
                num_stages=m.num_stages,
                registers=function.registers,
                stack_bytes=function.stack_bytes,
                local_bytes=function.local_bytes,
                shared_bytes=m.shared,
                fp_fusion=m.enable_fp_fusion,
            )
        )


class _CompileOnlyDriver(DriverBase):
    def __init__(self, arch: CudaArch) -> None:
        super().__init__()
        self.arch = arch
        self.builds: list[KernelBuild] = []
        self.utils = _Utils(arch)
        self.launcher_cls = _Launcher

    @classmethod
    def is_active(cls) -> bool:
        return False

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("compile-only driver")

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", self.arch.sm, _WARP)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self):
        raise NotImplementedError("compile-only driver: nothing runs")

    def get_current_device(self) -> int:
        # Triton caches compiled kernels per device: one key per architecture, away from
        # real device ordinals, so builds for two targets never mix.
        return 1000 + self.arch.sm

    def get_current_stream(self, device: int | None = None) -> int:
        return 0
