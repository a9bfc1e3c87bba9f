"""The router's CPU work off its event loop: a bounded pool of threads for a request's
preprocessing (chat template, tokenization, block hashing, grammar compilation).

The event loop streams every request's tokens; a 100,000-character prompt tokenized on it
would hold every other stream's next chunk for as long as that takes. In a thread, the
Rust tokenizer runs without the GIL, and the pure-Python parts (template rendering,
hashing) give the loop the GIL back at every switch interval (5 ms), so the loop's stalls
are bounded by that instead of by the longest prompt (docs/router.md).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Threads by default: tokenizing runs without the GIL, so up to a few requests' prompts at
# once use as many cores; more would only queue behind the GIL for template rendering.
DEFAULT_WORKERS = 4


class CpuPool:
    """Owns a thread pool of `num_workers`; `run` awaits one call in it. Calls beyond
    `num_workers` wait their turn in the pool's queue (the router's in-flight bound keeps
    that queue short). `close` waits for running calls and drops none."""

    def __init__(self, num_workers: int = DEFAULT_WORKERS) -> None:
        if num_workers < 1:
            raise ValueError(f"the CPU pool needs at least one worker, not {num_workers}")
        self.num_workers = num_workers
        self._executor = ThreadPoolExecutor(num_workers, thread_name_prefix="router-cpu")

    async def run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)` on a pool thread, in a copy of the caller's context (its
        request id is in the log lines it writes); what it raises is raised here."""
        call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        self._executor.shutdown(wait=True)
