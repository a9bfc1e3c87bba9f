"""Host tensors on the kernel's huge pages (hugetlbfs), for a KV pool in CPU memory.

A cross-process NIXL write of host memory goes through UCX's `cma` transport, i.e.
`process_vm_writev`, which pins the target's pages one at a time: on 4 KiB pages the
pinning is a fifth of a 2 MiB write (docs/performance.md). On 2 MiB huge pages it is one pin
per page. Huge pages must be reserved by the administrator (`sysctl vm.nr_hugepages=N`, or a
`hugepages-2Mi` resource limit in Kubernetes); nothing here reserves them.
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path

import torch

MAP_HUGETLB = 0x40000  # <linux/mman.h>, the same on x86-64 and arm64; not in Python's mmap
MEMINFO = Path("/proc/meminfo")


def meminfo(field: str, path: Path = MEMINFO) -> int:
    """One `/proc/meminfo` figure: kB fields in bytes, page counts as counts."""
    for line in path.read_text().splitlines():
        name, _, value = line.partition(":")
        if name == field:
            number, *unit = value.split()
            return int(number) * (1024 if unit == ["kB"] else 1)
    raise OSError(f"{path} has no {field!r}: this kernel offers no huge pages")


def huge_page_bytes() -> int:
    """The default huge page size (what MAP_HUGETLB maps)."""
    return meminfo("Hugepagesize")


def free_huge_pages() -> int:
    return meminfo("HugePages_Free")


def hugepage_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zeroed, contiguous CPU tensor on huge pages, its pages populated now (the kernel
    zeroes them as it maps them). The mapping lives as long as the tensor (and its views).

    Raises OSError, naming the pages wanted and free, when too few are reserved."""
    nbytes = math.prod(shape) * dtype.itemsize
    page = huge_page_bytes()
    num_pages = max(1, -(-nbytes // page))
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB | mmap.MAP_POPULATE
    try:
        region = mmap.mmap(-1, num_pages * page, flags=flags)
    except OSError as e:
        raise OSError(
            e.errno,
            f"cannot map {num_pages} huge pages of {page >> 20} MiB ({free_huge_pages()} "
            "free): reserve them with `sysctl vm.nr_hugepages=N` (in Kubernetes, a "
            "hugepages-2Mi limit), or run without huge pages",
        ) from e
    flat = torch.frombuffer(region, dtype=torch.uint8, count=nbytes)  # keeps `region` alive
    return flat.view(dtype).view(shape)
