"""A simulated prefill worker: prompt-only batches in the real scheduler, and after every
step a write of the blocks completed so far under a hold on the source blocks, as
`PrefillNode` does; the notification with the first token goes out once every write of
the job has landed. Writes of one node share its link, one after another. The loop sees a
write end between its steps; before a step, while a job that has its first token still has
a write in flight, it waits for that write for at most `LAST_WRITE_WAIT_SHARE` of its last
step and notifies as soon as it lands (`wait_before_step`), as `PrefillNode.step` does.

Jobs end early as in `PrefillNode`: an abort from the decode node, or a passed deadline
(checked before each step and before each write). The decode node hears of it (`AbortAck`,
`PrefillFailed`) only once no write of the job is in flight; an abort of a job this worker
does not know (a restarted worker) is confirmed at once. Jobs are keyed by the decode node's
agent too (`prefill_job_key`), so a request the router retried on another decode node is
not taken for the dead node's attempt.

A decode node that dies fails the writes into it, as NIXL does: a write that had not landed
when it died ends in error (`write`), and from one hop after its death (when this worker's
connection to it has failed) posting a write raises (`post`) and so does the notification
(`notify`). Each ends the job as `PrefillNode` does (`transfer`, or `notify`), releasing
its holds; its `PrefillFailed` goes nowhere. A job that has posted nothing yet keeps its
place in the batch until its first write, as in `PrefillNode`. The failures are counted
by reason, as `tandem_kv_transfer_failures_total` counts them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tandem.engine.core.config import LAST_WRITE_WAIT_SHARE
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import ModelRunnerOutput, SchedulerOutput, prefill_job_key
from tandem.sim.decode import RemotePrefill, SimDecode
from tandem.sim.node import SAMPLED_TOKEN, SimNode
from tandem.sim.transfer_model import TransferModel, num_runs


@dataclass
class Job:
    msg: RemotePrefill
    request: Request
    deadline_s: float  # simulated; no write starts after it
    received_s: float  # when the loop took the request
    num_posted: int  # prompt blocks written or being written (starts at skip_blocks)
    num_writes: int = 0  # in flight
    token_id: int | None = None
    sampled_s: float = 0.0  # when its first token was sampled
    ended: str | None = None  # "abort" or a failure reason
    waited: bool = False  # a step already waited for its last writes: never again


class SimPrefill(SimNode):
    transfer: TransferModel

    def setup_transfers(self, transfer: TransferModel) -> None:
        self.transfer = transfer
        self.jobs: dict[str, Job] = {}
        self.link_free_s = 0.0
        self.num_bytes = 0
        self.num_blocks_sent = 0
        self._num_writes = 0
        self._failed: dict[str, str] = {}  # this step's jobs that could not write
        self._waits = 0  # waits for last writes begun; the current one's number
        self._waiting = False
        self._waited: list[Job] = []  # the jobs the current wait is for
        self.transfer_failures: Counter[str] = Counter()  # "post", "write", "notify"

    def submit(self, msg: RemotePrefill) -> None:
        key = prefill_job_key(msg.decode.agent, msg.request_id, msg.attempt)
        now = self.cluster.events.now
        if key in self.jobs or now - msg.sent_s > msg.deadline_s:
            self._reply(msg, "invalid")
            return
        params = SamplingParams(max_tokens=1, ignore_eos=True)
        request = Request(key, msg.token_ids, params)
        request.block_hashes = list(msg.block_hashes)  # as the node would compute them
        deadline = now + msg.deadline_s
        self.jobs[key] = Job(msg, request, deadline, now, msg.skip_blocks)
        self.cluster.events.at(deadline, self.poke)  # expire it even when idle
        self.add(request)

    def abort(self, decode: SimDecode, request_id: str, attempt: int) -> None:
        job = self.jobs.get(prefill_job_key(decode.agent, request_id, attempt))
        if job is None:
            self.cluster.send(decode.deliver, decode.on_reply, request_id, attempt, None)
            return
        self._end(job, "abort")

    # -- the step -------------------------------------------------------------------------

    def before_schedule(self) -> None:
        now = self.cluster.events.now
        for job in list(self.jobs.values()):
            if job.ended is None and job.token_id is None and now >= job.deadline_s:
                self._end(job, "deadline")

    def before_update(self, out: SchedulerOutput, result: ModelRunnerOutput) -> None:
        for request, n in zip(out.scheduled, out.num_scheduled_tokens):
            job = self.jobs[request.request_id]
            if job.ended is not None:
                continue
            num_computed = request.num_computed_tokens + n
            ready = self.kv.num_ready_blocks(request.num_prompt_tokens, num_computed)
            if ready <= job.num_posted:
                continue
            if self.cluster.events.now > job.deadline_s:
                self._failed[job.request.request_id] = "deadline"
                continue
            if self._lost(job.msg.decode):
                self.transfer_failures["post"] += 1  # the write raises: nothing is in flight
                self._failed[job.request.request_id] = "transfer"
                continue
            self._post(job, ready)

    def _lost(self, decode: SimDecode) -> bool:
        """Whether this worker's connection to `decode` has failed: it died a hop ago."""
        if decode.died_s is None:
            return False
        return self.cluster.events.now >= decode.died_s + self.cluster.profile.network_latency_s

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
        self.cluster.events.at(self.link_free_s, self._landed, job, hold)

    def _landed(self, job: Job, hold: str) -> None:
        """The write ended: in error if its decode node was dead by then. The loop sees it
        between its steps, as `PrefillNode.poll` runs after each step, and at once while
        it waits for finished jobs' last writes."""
        if not self._waiting:
            self.deliver(self._write_done, job, hold, job.msg.decode.dead)
            return
        self._write_done(job, hold, job.msg.decode.dead)
        if not self._finishing():
            self._end_wait(self._waits)

    def wait_before_step(self) -> bool:
        """As `PrefillNode.step`: with a batch due and a finished job's write in flight,
        wait until the writes of finished jobs land or `LAST_WRITE_WAIT_SHARE` of the last
        step has passed."""
        finishing = self._finishing()
        if not (self.scheduler.has_unfinished_requests() and finishing):
            return False
        bound = LAST_WRITE_WAIT_SHARE * self.last_step_s
        if bound <= 0.0:
            return False
        self._waits += 1
        self._waited = finishing
        self._waiting = self.stepping = True  # messages wait for the loop, as in a step
        self.cluster.events.after(bound, self._end_wait, self._waits)
        return True

    def _end_wait(self, wait: int) -> None:
        if self._waiting and wait == self._waits:
            self._waiting = False
            for job in self._waited:  # waited for once, as PrefillNode does
                job.waited = True
            self.resume()

    def _finishing(self) -> list[Job]:
        """The jobs that have their first token, wait only for their writes, and have not
        been waited for yet."""
        jobs = self.jobs.values()
        return [j for j in jobs if j.num_writes and j.token_id is not None and not j.waited]

    def after_update(
        self, out: SchedulerOutput, result: ModelRunnerOutput, finished: list[Request]
    ) -> None:
        for request in finished:
            job = self.jobs[request.request_id]
            if job.ended is None and request.request_id not in self._failed:
                job.token_id, job.sampled_s = SAMPLED_TOKEN, self.cluster.events.now
                self.cluster.on_prefilled(job.msg.request_id, request.num_cached_tokens)
                self._settle(job)
        failed, self._failed = self._failed, {}
        for key, reason in failed.items():
            self._end(self.jobs[key], reason)

    def _write_done(self, job: Job, hold: str, failed: bool) -> None:
        if self.dead:
            return
        self.kv.release(hold)
        job.num_writes -= 1
        if failed:  # its decode node died before the write landed: it ended in error
            self.transfer_failures["write"] += 1
            self._end(job, "transfer")
        else:
            self._settle(job)
        self.poke()  # released blocks may let a waiting prompt in

    # -- ending a job ---------------------------------------------------------------------

    def _end(self, job: Job, reason: str) -> None:
        """Stop a job: its request leaves the batch now; the decode node hears once no
        write is in flight."""
        if job.ended is None:
            job.ended, job.token_id = reason, None
            self.scheduler.finish_requests([job.request.request_id], RequestStatus.FINISHED_ABORTED)
        self._settle(job)

    def _settle(self, job: Job) -> None:
        if job.num_writes or (job.ended is None and job.token_id is None):
            return
        del self.jobs[job.request.request_id]
        msg = job.msg
        if job.ended is None and self._lost(msg.decode):
            self.transfer_failures["notify"] += 1  # every write landed; the notify raises
            self._reply(msg, "notify")
        elif job.ended is None:
            self.cluster.send(
                msg.decode.deliver, msg.decode.on_prefill_done, msg.request_id, msg.attempt,
                job.token_id, job.sampled_s - job.received_s,
            )  # fmt: skip
        else:
            self._reply(msg, None if job.ended == "abort" else job.ended)

    def _reply(self, msg: RemotePrefill, failure: str | None) -> None:
        decode = msg.decode
        self.cluster.send(decode.deliver, decode.on_reply, msg.request_id, msg.attempt, failure)
