"""The end of one step's device work, for a reader outside the stream: a NIXL WRITE reads
the KV cache on the host's say-so, not in stream order, so it must not start before the
kernels that wrote those blocks have run."""

from __future__ import annotations

import torch


class StepEvent:
    """Recorded on the current stream after a step's kernels; `wait()` blocks the host until
    they ran. On the CPU every op has run when `execute` returns: `wait()` returns at once."""

    def __init__(self, event: torch.cuda.Event | None = None) -> None:
        self._event = event

    @classmethod
    def record(cls, device: torch.device) -> StepEvent:
        """An event after everything queued on `device`'s current stream so far."""
        if device.type != "cuda":
            return cls()
        event = torch.cuda.Event()
        event.record()
        return cls(event)

    def wait(self) -> None:
        """Block until the step's kernels ran (idempotent; cheap once they have)."""
        if self._event is not None:
            self._event.synchronize()
