"""A simulated decode node: the real scheduler's remote-prefill decision (threshold, all or
nothing reservation, destination blocks), then continuous-batched decode. Mirrors
`DecodeWorker.step` and `_complete_remote`, without failures: a simulated prefill worker
always answers, so fail-over and the decode side's holds are not exercised."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tandem.engine.request import Request
from tandem.engine.scheduler import SchedulerOutput
from tandem.sim.node import SimNode

if TYPE_CHECKING:
    from tandem.sim.prefill import SimPrefill


@dataclass(frozen=True)
class RemotePrefill:
    """What a decode node sends a prefill worker (`PrefillRequest`'s fields that matter)."""

    request_id: str
    attempt: int
    token_ids: list[int]
    block_hashes: list[int]
    skip_blocks: int
    dst_block_ids: list[int]
    decode: SimDecode


class SimDecode(SimNode):
    def before_run(self, out: SchedulerOutput) -> None:
        for request in out.remote_prefills:
            self.cluster.on_admitted(request, remote=True)
            prefill: SimPrefill = self.cluster.prefill_at(request.prefill_worker)
            msg = RemotePrefill(
                request.request_id,
                request.num_remote_attempts,
                request.prompt_token_ids,
                request.block_hashes,
                request.num_remote_skip_blocks,
                list(self.scheduler.remote_destination(request)),
                self,
            )
            self.cluster.send(prefill.submit, msg)
        for request in out.scheduled:
            self.cluster.on_admitted(request, remote=False)

    def after_update(
        self, out: SchedulerOutput, sampled: list[int | None], finished: list[Request]
    ) -> None:
        for request, token in zip(out.scheduled, sampled):
            if token is not None:
                self.cluster.on_token(request)

    def on_prefill_done(self, request_id: str, attempt: int, token_id: int) -> None:
        """The prefill worker's notification (after its last write landed)."""
        request = self.scheduler.remote.get(request_id)
        if request is None or request.num_remote_attempts != attempt:
            return
        self.scheduler.complete_remote_prefill(request_id, token_id, None)
        self.cluster.on_token(request)
        self.poke()
