"""The lines of a decode worker's stream, each read bounded: by `read_timeout_s` since the
previous line, and by the worker's ejection (its health checks failed), which ends every
read in progress on its streams at once (docs/router.md "Health, retries, disconnects")."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from tandem.router.workers import WorkerState


class ReadCut(Exception):
    """A read from a worker's stream was cut short: no line within the bound, or the
    worker was ejected. The message says which."""


async def bounded_lines(
    lines: AsyncIterator[str], worker: WorkerState | None, read_timeout_s: float
) -> AsyncIterator[str]:
    """`lines`, each awaited at most `read_timeout_s`; ReadCut when a read takes longer or
    `worker` (None: not in the pool, no ejection to watch) is ejected by its health checks
    while the stream is open. A read in progress registers its timeout in
    `worker.open_reads` for the time it waits, so that the ejection can expire it."""
    epoch = worker.ejections if worker is not None else 0
    while True:
        try:
            async with asyncio.timeout(read_timeout_s) as scope:
                if worker is not None:
                    _check(worker, epoch)
                    worker.open_reads.add(scope)
                try:
                    line = await anext(lines)
                finally:
                    if worker is not None:
                        worker.open_reads.discard(scope)
        except StopAsyncIteration:
            return
        except TimeoutError:
            if worker is not None:
                _check(worker, epoch)
            raise ReadCut(f"no record for {read_timeout_s:g} s") from None
        yield line


def _check(worker: WorkerState, epoch: int) -> None:
    if worker.ejections != epoch:
        raise ReadCut(f"{worker.url} was ejected (its health checks failed)")
