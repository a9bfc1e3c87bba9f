"""A simulated prefill worker: prompt-only batches in the real scheduler, and after every
step a write of the blocks completed so far under a hold on the source blocks, as
`PrefillWorker` does; the notification with the first token goes out once every write of
the job has landed. Writes of one node share its link, one after another."""

from __future__ import annotations

from dataclasses import dataclass

from tandem.engine.request import Request
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.scheduler import SchedulerOutput, remote_hold_key
from tandem.sim.decode import RemotePrefill
from tandem.sim.node import SAMPLED_TOKEN, SimNode
from tandem.sim.transfer_model import TransferModel, num_runs


@dataclass
class Job:
    msg: RemotePrefill
    request: Request
    num_posted: int  # prompt blocks written or being written (starts at skip_blocks)
    num_writes: int = 0  # in flight
    token_id: int | None = None


class SimPrefill(SimNode):
    transfer: TransferModel

    def setup_transfers(self, transfer: TransferModel) -> None:
        self.transfer = transfer
        self.jobs: dict[str, Job] = {}
        self.link_free_s = 0.0
        self.num_bytes = 0
        self.num_blocks_sent = 0
        self._num_writes = 0

    def submit(self, msg: RemotePrefill) -> None:
        key = remote_hold_key(msg.request_id, msg.attempt)
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        request = Request(key, msg.token_ids, params)
        request.block_hashes = list(msg.block_hashes)  # as the node would compute them
        self.jobs[key] = Job(msg, request, msg.skip_blocks)
        self.add(request)

    def before_update(self, out: SchedulerOutput) -> None:
        for request, n in zip(out.scheduled, out.num_scheduled_tokens):
            job = self.jobs[request.request_id]
            num_computed = request.num_computed_tokens + n
            ready = self.kv.num_ready_blocks(request.num_prompt_tokens, num_computed)
            if ready > job.num_posted:
                self._post(job, ready)

    def _post(self, job: Job, ready: int) -> None:
        start, skip = job.num_posted, job.msg.skip_blocks
        key = job.request.request_id
        src = self.kv.block_ids(key)[start:ready]
        dst = job.msg.dst_block_ids[start - skip : ready - skip]
        self._num_writes += 1
        hold = f"{key}#w{self._num_writes}"
        self.kv.hold(hold, key, start, ready)
        seconds = self.transfer.write_time(len(src), num_runs(src, dst))
        begin = max(self.cluster.events.now, self.link_free_s)
        self.link_free_s = begin + seconds
        job.num_posted = ready
        job.num_writes += 1
        self.num_blocks_sent += len(src)
        self.num_bytes += len(src) * self.transfer.block_bytes
        self.cluster.events.at(self.link_free_s, self._write_done, job, hold)

    def after_update(
        self, out: SchedulerOutput, sampled: list[int | None], finished: list[Request]
    ) -> None:
        for request in finished:
            job = self.jobs[request.request_id]
            job.token_id = SAMPLED_TOKEN
            self.cluster.on_prefilled(job.msg.request_id, request.num_cached_tokens)
            self._settle(job)

    def _write_done(self, job: Job, hold: str) -> None:
        self.kv.release(hold)
        job.num_writes -= 1
        self._settle(job)
        self.poke()  # released blocks may let a waiting prompt in

    def _settle(self, job: Job) -> None:
        if job.token_id is None or job.num_writes:
            return
        del self.jobs[job.request.request_id]
        msg = job.msg
        self.cluster.send(msg.decode.on_prefill_done, msg.request_id, msg.attempt, job.token_id)
