"""The KV tiers' bookkeeping (`KVTiers` under the scheduler), isolated from the model and
the copier: a test-only runner writes each full block's content (its chained hash) into a
model of the device pool and checks, at every step, that every block a request reads holds
the content its prefix needs; a test-only transport runs the tiers' copies on such models
of the host and disk tiers, in submission order, only when the test lets it. So a block
reused while a copy still reads it, a slot overwritten before its block moved on, or a load
from the wrong slot shows up as wrong content."""

from __future__ import annotations

import random
from collections import deque

import pytest

from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.kv_tiers import MAX_LOAD_SECONDS, TierChanges
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from tandem.engine.core.tier_index import TierIndex
from tandem.engine.core.tier_ops import DEVICE, DISK, HOST, TierCopy
from tests.engine.test_scheduler import fake_token

BS = 4


class ModelTransport:
    """Runs copies on dicts (tier -> slot -> content) when `run` says so, in order."""

    def __init__(self, device: dict[int, int]) -> None:
        self.tiers = {DEVICE: device, HOST: {}, DISK: {}}
        self.queued: deque[TierCopy] = deque()
        self.done: list[tuple[int, bool]] = []
        self.fail_next = 0

    def submit(self, copy: TierCopy) -> None:
        self.queued.append(copy)

    def run(self, n: int | None = None) -> None:
        for _ in range(len(self.queued) if n is None else min(n, len(self.queued))):
            copy = self.queued.popleft()
            ok = self.fail_next == 0
            if ok:
                src, dst = self.tiers[copy.src], self.tiers[copy.dst]
                rows = [src.get(s) for s in copy.src_slots]  # gather, then scatter
                dst.update(zip(copy.dst_slots, rows))
            else:
                self.fail_next -= 1
                for slot in copy.dst_slots:  # a failed copy leaves garbage behind
                    self.tiers[copy.dst][slot] = -1
            self.done.append((copy.copy_id, ok))

    def poll(self) -> list[tuple[int, bool]]:
        done, self.done = self.done, []
        return done


def make(
    blocks: int, host: int, disk: int = 0, tokens: int = 64, seqs: int = 8, events: bool = True
):
    kv = KVCacheManager(block_size=BS, num_blocks=blocks, record_events=events)
    device: dict[int, int] = {}
    transport = ModelTransport(device)
    kv.attach_tiers(transport, host, disk)
    return Scheduler(SchedulerConfig(tokens, seqs, 512), kv), transport


def model_run(s: Scheduler, out: SchedulerOutput, device: dict[int, int]) -> ModelRunnerOutput:
    """Check what each request reads, then write the full blocks it computes."""
    tokens = []
    for request, n in zip(out.scheduled, out.num_scheduled_tokens):
        table = s.kv.block_ids(request.request_id)
        start, end = request.num_computed_tokens, request.num_computed_tokens + n
        for i in range(start // BS):  # the full blocks before this step's tokens
            assert device.get(table[i]) == request.block_hashes[i], (request.request_id, i)
        s.kv.cache_blocks(request, end)  # the hashes of the blocks it completes
        for i in range(start // BS, end // BS):
            device[table[i]] = request.block_hashes[i]
        tokens.append(fake_token(request.all_token_ids) if end == request.num_tokens else None)
    return ModelRunnerOutput(tokens, [None] * len(tokens))


def step(s: Scheduler, transport: ModelTransport) -> list[Request]:
    out = s.schedule()
    finished = s.update_from_output(out, model_run(s, out, transport.tiers[DEVICE]))
    s.kv.check_integrity()
    return finished


def prompt(conversation: int, turn: int) -> list[int]:
    """Turn t of a conversation: its earlier turns' tokens, then 8 of its own."""
    return [1000 * conversation + i for i in range(8 * (turn + 1) + 1)]


def submit(s: Scheduler, rid: str, tokens: list[int], max_tokens: int = 2) -> Request:
    r = Request(rid, tokens, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    s.add_request(r)
    return r


def drain(s: Scheduler, transport: ModelTransport) -> None:
    """Run everything to the end, copies included."""
    while s.has_unfinished_requests() or transport.queued:
        transport.run()
        step(s, transport)


def a_pushed_down():
    """Request "a" (17 tokens: 4 full blocks) served, then "b" (5 blocks of the pool's 6),
    which evicts all but a's first block from the device: the rest is in the host tier."""
    s, t = make(blocks=6, host=32)
    submit(s, "a", prompt(0, 1))
    drain(s, t)
    submit(s, "b", prompt(1, 1))
    drain(s, t)
    return s, t


def test_a_block_evicted_from_the_device_is_loaded_back_from_the_host_tier():
    s, t = a_pushed_down()
    found = s.kv.get_computed_blocks(submit(s, "a2", prompt(0, 1)))
    assert found.num_tokens == BS and [h.tier for h in found.lower] == [HOST] * 3
    step(s, t)  # admission finds a's prefix in the host tier: a load, not a prefill
    (a2,) = s.loading.values()
    assert a2.status == RequestStatus.WAITING_FOR_KV_LOAD and not s.running
    step(s, t)  # the copy has not run: still loading
    assert s.loading == {"a2": a2}
    t.run()
    step(s, t)  # loaded: admitted with its prefix as device hits, computing only the rest
    assert a2.status == RequestStatus.RUNNING and a2.num_cached_tokens == 16
    assert s.kv.stats.tier_hits == {DEVICE: BS, HOST: 3 * BS}
    drain(s, t)


def test_a_stored_block_is_not_reused_until_its_copy_down_ran():
    s, t = make(blocks=5, host=32)
    submit(s, "a", prompt(0, 1))  # 4 full blocks published, copies queued, not run
    while s.has_unfinished_requests():
        step(s, t)
    held = s.kv.tiers.held_blocks()
    assert len(held) == 4 and all(b.ref_cnt == 1 for b in held)
    submit(s, "b", prompt(1, 0))  # 9 tokens + 2: needs 3 blocks, only 1 is free
    step(s, t)
    assert [r.request_id for r in s.waiting] == ["b"]
    t.run()
    drain(s, t)  # b ran once the copies freed the blocks; every read checked
    assert not s.kv.tiers.held_blocks()


def test_an_abort_during_a_load_leaves_its_blocks_held_until_the_copy_ran():
    s, t = a_pushed_down()
    submit(s, "a2", prompt(0, 1))
    step(s, t)
    assert "a2" in s.loading
    s.finish_requests(["a2"], RequestStatus.FINISHED_ABORTED)
    assert not s.loading and not s.has_unfinished_requests()
    assert len(s.kv.tiers.held_blocks()) == 4  # the copy still writes them
    t.run()
    s.schedule()
    counts = s.kv.check_integrity()
    assert counts.in_use == 0 and counts.free + counts.cached == 6
    assert not s.kv.tiers.in_flight


def test_a_failed_copy_down_forgets_the_blocks_and_a_failed_load_publishes_nothing():
    s, t = make(blocks=6, host=32)
    submit(s, "a", prompt(0, 1))
    while s.has_unfinished_requests():
        step(s, t)
    t.fail_next = 1
    t.run()
    s.schedule()
    assert len(s.kv.tiers.host) == 0  # the host tier does not claim what it never got
    assert s.kv.tiers.failed_copies == 1
    submit(s, "b", prompt(1, 1))
    drain(s, t)
    submit(s, "c", prompt(2, 1))  # pushes b out of the device pool
    drain(s, t)
    r = submit(s, "b2", prompt(1, 1))
    step(s, t)
    assert "b2" in s.loading
    t.fail_next = 1
    drain(s, t)  # the failed load: b2 computes its prompt, every read checked
    assert r.tier_loaded and s.kv.stats.tier_hits[HOST] == 3 * BS


def test_a_preempted_request_that_loads_comes_back_preempted_and_is_counted_once():
    s, t = a_pushed_down()
    r = submit(s, "a2", prompt(0, 1))
    r.status = RequestStatus.PREEMPTED  # as after a preemption: counted already
    step(s, t)
    assert "a2" in s.loading
    t.run()
    out = s.schedule()
    assert r.status == RequestStatus.RUNNING and out.num_local_decisions == 0
    assert s.kv.stats.tier_hits[HOST] == 0  # not counted again
    s.update_from_output(out, model_run(s, out, t.tiers[DEVICE]))
    drain(s, t)


def test_a_full_host_tier_demotes_to_disk_and_a_full_disk_tier_drops():
    s, t = make(blocks=8, host=4, disk=4)
    for c in range(3):
        submit(s, f"c{c}", prompt(c, 1))  # 4 full blocks each
        drain(s, t)
    tiers = s.kv.tiers
    assert tiers.counts()[HOST].used == 4 and tiers.counts()[DISK].used == 4
    ev = tiers.events
    assert len(ev.host_stored) == 12 and len(ev.host_removed) == 8
    assert len(ev.disk_stored) == 8 and len(ev.disk_removed) == 4
    assert set(ev.disk_stored) - set(ev.disk_removed) == set(tiers.disk._slots)
    submit(s, "c1again", prompt(1, 1))  # c1 sits on disk now
    drain(s, t)
    assert s.kv.stats.tier_hits[DISK] > 0
    assert len(tiers.drain_load_seconds()) == 1 and not tiers.drain_load_seconds()


def test_without_an_event_reader_nothing_accumulates():
    """The offline engine drains neither events nor load times: both stay bounded."""
    s, t = make(blocks=8, host=4, disk=4, events=False)
    for c in range(3):
        submit(s, f"c{c}", prompt(c, 1))
        drain(s, t)
    tiers = s.kv.tiers
    assert tiers.counts()[DISK].used == 4  # the tiers worked ...
    assert tiers.drain_events() == TierChanges()  # ... and recorded nothing
    tiers.load_seconds.extend([0.0] * (MAX_LOAD_SECONDS + 10))
    assert len(tiers.drain_load_seconds()) == MAX_LOAD_SECONDS


@pytest.mark.parametrize("seed", range(8))
def test_random_conversations_read_the_right_content_from_every_tier(seed):
    """Multi-turn conversations over a pool smaller than their working set, copies let run
    at random moments, some failing: every read checked, every reference accounted for, and
    at the end nothing is held."""
    rng = random.Random(seed)
    s, t = make(blocks=rng.choice([12, 16]), host=rng.choice([16, 32]), disk=rng.choice([0, 16]))
    turns = [0] * 5
    for i in range(60):
        c = rng.randrange(5)
        submit(s, f"r{i}", prompt(c, turns[c]), max_tokens=rng.randint(1, 4))
        turns[c] = min(turns[c] + 1, 4)
        for _ in range(rng.randint(0, 3)):
            if rng.random() < 0.1:
                t.fail_next = 1
            t.run(rng.randint(0, 2))
            step(s, t)
    drain(s, t)
    s.schedule()
    assert not s.kv.tiers.in_flight and not s.kv.tiers.held_blocks()
    counts = s.kv.check_integrity()
    assert counts.in_use == 0
    assert sum(s.kv.stats.tier_hits[x] for x in (HOST, DISK)) > 0  # the test loads


def test_an_empty_disk_tier_is_still_a_tier():
    s, _ = make(blocks=4, host=2, disk=3)
    assert {name: c.total for name, c in s.kv.tiers.counts().items()} == {HOST: 2, DISK: 3}


def test_the_tier_index_hands_out_every_slot_once_and_evicts_lru():
    index = TierIndex(HOST, 2)
    assert index.put(10) == (0, None) and index.put(11) == (1, None)
    index.touch(10)
    assert index.put(12) == (1, (11, 1))  # 11 was least recently used
    assert index.remove(12) is True and index.remove(12) is False
    assert index.check_integrity().free == 1
    with pytest.raises(ValueError):
        index.put(10)
