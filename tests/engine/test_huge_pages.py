"""glibc's huge-page tunable in a launched process's environment, and what it does there."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tandem.engine.api.huge_pages import TUNABLES, with_huge_pages

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def test_the_tunable_joins_those_set_and_a_users_choice_stays():
    assert with_huge_pages({"A": "1"}) == {"A": "1", TUNABLES: "glibc.malloc.hugetlb=1"}
    other = {TUNABLES: "glibc.malloc.arena_max=2"}
    assert with_huge_pages(other)[TUNABLES] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"
    mine = {TUNABLES: "glibc.malloc.hugetlb=0:glibc.malloc.arena_max=2"}
    assert with_huge_pages(mine) == mine


def _anon_huge_kib(env: dict[str, str]) -> int:
    """AnonHugePages of a child that fills 64 MiB of malloc'd memory (a bytearray)."""
    code = (
        "b = bytearray(64 << 20)\n"
        "b[::4096] = b'x' * len(b[::4096])\n"
        "for line in open('/proc/self/smaps_rollup'):\n"
        "    if line.startswith('AnonHugePages:'): print(line.split()[1])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_a_process_started_with_it_gets_huge_pages():
    mode = THP.read_text() if THP.exists() else ""
    if "[madvise]" not in mode:
        pytest.skip(f"transparent huge pages are {mode.strip() or 'absent'}, not on request")
    assert _anon_huge_kib({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) == 0
    assert _anon_huge_kib(with_huge_pages({})) >= 32 << 10
