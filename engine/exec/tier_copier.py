"""The copies between the KV cache and its lower tiers (`TierCopier`), on a thread of its
own: the step never waits for one.

The host tier is a tensor of the KV cache's block shape (pinned on a GPU, so copies are
asynchronous DMA on a side stream); the disk tier is a file of the same layout, mapped
(`disk_tensor`). Copies run in submission order (`tandem.engine.core.tier_ops`). On a GPU a
copy first waits for the kernels queued before its submission (a store reads blocks the
step just wrote). A copy that fails (the disk gone, a driver error) is reported failed and
the scheduler's side forgets what it wrote; the node goes on without it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
from collections import deque
from pathlib import Path

import torch

from tandem.engine.core.tier_ops import DEVICE, DISK, HOST, TierCopy

logger = logging.getLogger(__name__)

DISK_FILE = "tandem-kv-tier.bin"


def disk_tensor(
    folder: str, num_blocks: int, block_shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[torch.Tensor, int]:
    """A [num_blocks, *block_shape] tensor backed by a file under `folder`, its space
    reserved up front (a full disk fails here, at start, not as a fault mid-copy), and the
    descriptor that holds the file's lock while the tier lives: a second process given the
    same folder is refused rather than sharing the file. The file is rewritten at every
    start: the tier does not survive a restart."""
    path = Path(folder) / DISK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    numel = num_blocks
    for n in block_shape:
        numel *= n
    size = numel * torch.empty((), dtype=dtype).element_size()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ValueError(f"{path} is the disk KV tier of another process: give each its own "
                         "--kv-disk-dir") from None  # fmt: skip
    try:
        os.ftruncate(fd, 0)
        os.posix_fallocate(fd, 0, size)
    except OSError:
        os.close(fd)
        raise
    flat = torch.from_file(str(path), shared=True, size=numel, dtype=dtype)
    return flat.view(num_blocks, *block_shape), fd


class TierCopier:
    """Owns the lower tiers' tensors and the thread that copies; a `TierTransport`."""

    def __init__(
        self,
        kv_cache: torch.Tensor,
        host_blocks: int,
        disk_blocks: int = 0,
        disk_dir: str | None = None,
    ) -> None:
        """`kv_cache`: [num_blocks, *block_shape], the device pool's tensor."""
        block_shape = tuple(kv_cache.shape[1:])
        cuda = kv_cache.is_cuda
        host = torch.zeros((host_blocks, *block_shape), dtype=kv_cache.dtype, pin_memory=cuda)
        self.tensors = {DEVICE: kv_cache, HOST: host}  # each [blocks, *block_shape]
        self._disk_lock: int | None = None
        if disk_blocks:
            if disk_dir is None:
                raise ValueError("a disk tier needs a folder (--kv-disk-dir)")
            disk, self._disk_lock = disk_tensor(disk_dir, disk_blocks, block_shape, kv_cache.dtype)
            self.tensors[DISK] = disk
        self.stream = torch.cuda.Stream(kv_cache.device) if cuda else None
        self.failed: str | None = None  # the first failure, for /health and logs
        self._queue: queue.SimpleQueue[tuple[TierCopy, torch.cuda.Event | None] | None]
        self._queue = queue.SimpleQueue()
        self._done: deque[tuple[int, bool]] = deque()
        self._thread = threading.Thread(target=self._run, name="kv-tier-copier", daemon=True)
        self._thread.start()

    def submit(self, copy: TierCopy) -> None:
        event = None
        if self.stream is not None:
            event = torch.cuda.Event()
            event.record()  # after the kernels queued so far on the current stream
        self._queue.put((copy, event))

    def poll(self) -> list[tuple[int, bool]]:
        done = []
        while self._done:
            done.append(self._done.popleft())
        return done

    def close(self) -> None:
        """Finish the copies queued, then stop the thread and let the disk tier's file go.
        Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._disk_lock is not None:
            os.close(self._disk_lock)
            self._disk_lock = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            copy, event = item
            try:
                self._copy(copy, event)
                ok = True
            except Exception as exc:
                logger.exception("KV tier copy %s -> %s failed", copy.src, copy.dst)
                self.failed = self.failed or f"{type(exc).__name__}: {exc}"
                ok = False
            self._done.append((copy.copy_id, ok))

    @torch.inference_mode()
    def _copy(self, copy: TierCopy, event: torch.cuda.Event | None) -> None:
        src, dst = self.tensors[copy.src], self.tensors[copy.dst]
        if self.stream is None:
            index = torch.tensor(copy.dst_slots, dtype=torch.long)
            rows = src[torch.tensor(copy.src_slots, dtype=torch.long)]  # [n, *block_shape]
            dst.index_copy_(0, index, rows)
            return
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(event)
            for s, d in zip(copy.src_slots, copy.dst_slots):
                dst[d].copy_(src[s], non_blocking=True)
        self.stream.synchronize()
