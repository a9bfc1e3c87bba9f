"""The scheduler under random traffic: requests that share prefixes, arrive between steps
and are aborted at any point, in a pool small enough that preemption is routine; some are
prefilled remotely (as on a decode node), and their prefill workers answer, fail (a retry
on another worker or here) or confirm aborts in any order.

The test-only runner of `test_scheduler` samples a token that depends only on the sequence
so far, and so does the simulated prefill worker, so every request that finishes must carry
exactly the tokens it would have had alone, whatever was preempted, recomputed, retried or
served from the prefix cache around it. After every action the block census must balance
and no block may belong to a request that is not running or waiting for its remote KV; at
the end no request and no block may be unaccounted for.
"""

from __future__ import annotations

import zlib

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import remote_hold_key
from tests.engine.test_scheduler import VOCAB, fake_run, make_scheduler

TOKEN_BUDGET, MAX_SEQS = 12, 3
PREFIX_LEN, MAX_TAIL, MAX_OUTPUT = 8, 10, 8  # longest sequence: 26 tokens, 7 blocks of 4


def shared_prefix_prompt(prefix: int, tail: int, number: int) -> list[int]:
    """Request `number`'s prompt: one of a few shared prefixes of two full blocks (so prefix
    hits are frequent), then `tail` tokens of its own."""
    return [prefix + 1] * PREFIX_LEN + [(37 * number + i) % VOCAB for i in range(tail)]


def tokens_alone(prompt: list[int], max_tokens: int) -> list[int]:
    """What `fake_run` samples for this prompt when nothing else runs."""
    sequence, out = list(prompt), []
    for _ in range(max_tokens):
        token = zlib.crc32(",".join(map(str, sequence)).encode()) % VOCAB
        sequence.append(token)
        out.append(token)
    return out


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        # 9 blocks of 4 tokens: one request always fits, three rarely do.
        self.scheduler = make_scheduler(tokens=TOKEN_BUDGET, seqs=MAX_SEQS, blocks=9)
        self.expected: dict[str, list[int]] = {}  # request id -> its tokens when alone
        self.finished: dict[str, list[int]] = {}
        self.aborted: dict[str, list[int]] = {}
        # Remote attempt (its hold key) -> the blocks its worker writes into.
        self.destinations: dict[str, list[int]] = {}
        # Attempts given up (failed or aborted) whose worker may still write: their blocks
        # must stay reserved until the worker confirms.
        self.in_flight: dict[str, list[int]] = {}
        self.count = 0

    @rule(
        prefix=st.integers(0, 2),
        tail=st.integers(0, MAX_TAIL),
        max_tokens=st.integers(1, MAX_OUTPUT),
        remote=st.booleans(),
    )
    def add(self, prefix: int, tail: int, max_tokens: int, remote: bool) -> None:
        prompt = shared_prefix_prompt(prefix, tail, self.count)
        request_id = f"r{self.count}"
        self.count += 1
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        request = Request(request_id, prompt, params)
        request.prefill_worker = "tcp://p1" if remote else None
        self.scheduler.add_request(request)
        self.expected[request_id] = tokens_alone(prompt, max_tokens)

    @precondition(lambda self: self.scheduler.has_unfinished_requests())
    @rule()
    def step(self) -> None:
        out = self.scheduler.schedule()
        for request in out.remote_prefills:
            key = remote_hold_key(request.request_id, request.num_remote_attempts)
            self.destinations[key] = self.scheduler.remote_destination(request)
        assert out.total_num_scheduled_tokens <= TOKEN_BUDGET
        assert len(out.scheduled) <= MAX_SEQS
        if not self.scheduler.remote and not self.in_flight:
            assert out.scheduled or out.preempted, "a step with work did nothing"
        # The model must run at least one token of each scheduled request to sample from it,
        # even when the prefix cache holds its whole prompt.
        assert all(n >= 1 for n in out.num_scheduled_tokens), out.num_scheduled_tokens
        for request in self.scheduler.update_from_output(out, fake_run(out)):
            self.finished[request.request_id] = list(request.output_token_ids)
        self._drain_holds()

    @precondition(lambda self: self.scheduler.remote)
    @rule(data=st.data())
    def remote_kv_lands(self, data: st.DataObject) -> None:
        self._complete(data.draw(st.sampled_from(sorted(self.scheduler.remote))))

    @precondition(lambda self: self.scheduler.remote)
    @rule(data=st.data(), worker=st.sampled_from(["tcp://p2", None]))
    def remote_prefill_fails(self, data: st.DataObject, worker: str | None) -> None:
        """Retried on another worker, or prefilled here (None)."""
        request_id = data.draw(st.sampled_from(sorted(self.scheduler.remote)))
        self._give_up_remote(request_id)
        self.scheduler.retry_remote(request_id, worker)
        self._drain_holds()

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data())
    def prefill_worker_confirms_abort(self, data: st.DataObject) -> None:
        self._release(data.draw(st.sampled_from(sorted(self.in_flight))))

    @precondition(lambda self: self.scheduler.has_unfinished_requests())
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        request_id = data.draw(st.sampled_from(sorted(self.scheduler.requests)))
        if request_id in self.scheduler.remote:
            self._give_up_remote(request_id)
        aborted = self.scheduler.finish_requests([request_id], RequestStatus.FINISHED_ABORTED)
        assert [r.request_id for r in aborted] == [request_id]
        self.aborted[request_id] = list(aborted[0].output_token_ids)
        self._drain_holds()

    def _complete(self, request_id: str) -> None:
        """The prompt's KV has landed; the prefill worker sampled the first token."""
        first = self.expected[request_id][0]
        request = self.scheduler.complete_remote_prefill(request_id, first, None)
        if request is not None:
            self.finished[request_id] = list(request.output_token_ids)

    def _give_up_remote(self, request_id: str) -> None:
        request = self.scheduler.remote[request_id]
        key = remote_hold_key(request_id, request.num_remote_attempts)
        self.in_flight[key] = self.destinations[key]

    def _drain_holds(self) -> None:
        """What the decode node does: take the holds and ask their workers to abort."""
        assert {hold.key for hold in self.scheduler.abandoned_remote} <= self.in_flight.keys()
        self.scheduler.abandoned_remote.clear()

    def _release(self, key: str) -> None:
        """The worker confirmed it will not write: the blocks may be reused."""
        del self.in_flight[key]
        assert self.scheduler.kv.release(key)

    @invariant()
    def blocks_balance(self) -> None:
        kv = self.scheduler.kv
        counts = kv.check_integrity()  # each reference count matches its owners
        owners = {r.request_id for r in self.scheduler.running} | self.scheduler.remote.keys()
        for request_id in self.expected.keys() - owners:
            assert kv.block_ids(request_id) == [], f"{request_id} keeps blocks it cannot use"
        assert sorted(kv.hold_keys()) == sorted(self.in_flight)
        owned = {b for request_id in owners for b in kv.block_ids(request_id)}
        assert len(owned) <= counts.in_use <= len(owned) + kv.num_held_blocks
        # A worker may still write into an abandoned destination: no one else may have it.
        for key, blocks in self.in_flight.items():
            reused = owned & set(blocks)
            assert not reused, f"blocks {reused} of {key} reused before the worker confirmed"

    @invariant()
    def tokens_so_far_are_the_ones_alone(self) -> None:
        for request in self.scheduler.requests.values():
            expected = self.expected[request.request_id]
            assert request.output_token_ids == expected[: len(request.output_token_ids)]

    def teardown(self) -> None:
        for _ in range(1000):  # far more steps than the queued work needs: no livelock
            for request_id in sorted(self.scheduler.remote):
                self._complete(request_id)
            for key in sorted(self.in_flight):
                self._release(key)
            if not self.scheduler.has_unfinished_requests():
                break
            self.step()
        assert not self.scheduler.has_unfinished_requests(), "requests never finish"
        assert self.scheduler.kv.check_integrity().in_use == 0
        assert self.finished.keys() | self.aborted.keys() == self.expected.keys()
        assert not self.finished.keys() & self.aborted.keys()
        for request_id, tokens in self.finished.items():
            assert tokens == self.expected[request_id], request_id
        for request_id, tokens in self.aborted.items():
            assert tokens == self.expected[request_id][: len(tokens)], request_id


SchedulerMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None
)
test_scheduler_state_machine = SchedulerMachine.TestCase
