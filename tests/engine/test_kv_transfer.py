"""The transfer module: runs of blocks, descriptors, messages, and a real NIXL write
between two processes compared bit for bit."""

from __future__ import annotations

import multiprocessing as mp
import time

import pytest
import torch

from tandem.engine.core.request import TokenLogprobs
from tandem.engine.core.sampling_params import SamplingParams
from tandem.engine.exec.host_memory import hugepage_zeros
from tandem.engine.transfer.descriptors import block_runs, run_descs
from tandem.engine.transfer.messages import (
    AbortAck,
    AgentInfo,
    KVLayout,
    PrefillDone,
    PrefillRequest,
    WireLogprobs,
    decode_done,
    decode_from_prefill,
    decode_to_prefill,
    encode,
    from_wire,
    to_wire,
)
from tandem.engine.transfer.nixl_agent import KVTransferAgent, new_agent_name
from tests.bounds import HANG_S

SHAPE = (12, 2, 2, 4, 2, 8)  # [blocks, layers, K/V, block_size, kv_heads, head_dim]


def test_block_runs_merge_only_when_both_sides_are_adjacent():
    assert block_runs([3, 4, 5, 9], [0, 1, 2, 3]) == [(3, 0, 3), (9, 3, 1)]
    assert block_runs([1, 2, 3], [7, 9, 10]) == [(1, 7, 1), (2, 9, 2)]
    assert block_runs([], []) == []
    assert block_runs([5, 4], [1, 2]) == [(5, 1, 1), (4, 2, 1)]
    with pytest.raises(ValueError, match="2 source blocks but 1"):
        block_runs([1, 2], [3])


def test_run_descs_address_whole_blocks():
    layout = KVLayout(base_addr=1000, block_bytes=64, num_blocks=10, device_id=0, mem_type="DRAM")
    runs = [(2, 5, 3), (7, 0, 1)]
    assert run_descs(layout, runs, 0) == [(1128, 192, 0), (1448, 64, 0)]
    assert run_descs(layout, runs, 1) == [(1320, 192, 0), (1000, 64, 0)]


def test_messages_round_trip():
    info = AgentInfo("decode-x-1", b"\x00meta", KVLayout(1, 2, 3, 0, "DRAM"))
    req = PrefillRequest(
        "r1", 2, [1, 2, 3], SamplingParams(temperature=0.5, seed=9, logit_bias={3: 1.5}), 0, [4],
        info, 5.0, time.time(),
    )  # fmt: skip
    assert decode_to_prefill(encode(req)) == req
    assert decode_from_prefill(encode(AbortAck("r1", 2))) == AbortAck("r1", 2)
    lp = TokenLogprobs(7, -0.5, 1, ((7, -0.5), (3, -1.0)))
    done = PrefillDone("r1", 2, 7, to_wire(lp), 1, 64, 0.1, 0.2)
    back = decode_done(encode(done))
    assert back == done and from_wire(back.logprobs) == lp
    assert isinstance(back.logprobs, WireLogprobs)


def test_agent_names_carry_a_boot_id():
    a, b = new_agent_name("prefill-pod"), new_agent_name("prefill-pod")
    assert a != b and a.startswith("prefill-pod-") and b.startswith("prefill-pod-")


def _zeros(hugepages: bool) -> torch.Tensor:
    return hugepage_zeros(SHAPE, torch.float32) if hugepages else torch.zeros(SHAPE)


def _target(conn, hugepages: bool) -> None:
    """The decode side: registers a zeroed cache, reports it, waits, returns its bytes."""
    torch.set_num_threads(1)
    cache = _zeros(hugepages)
    agent = KVTransferAgent(new_agent_name("decode"), cache)
    conn.send(agent.info())
    deadline = time.monotonic() + HANG_S  # the other side may take long to get going
    notes: list[bytes] = []
    while not notes and time.monotonic() < deadline:
        notes = [m for _, m in agent.notifications()]
        time.sleep(0.001)
    conn.send((notes, cache.numpy().tobytes()))


@pytest.mark.parametrize("hugepages", [False, True], ids=["4k-pages", "huge-pages"])
def test_nixl_write_between_processes_is_bit_exact(hugepages, free_hugepages):
    if hugepages:
        free_hugepages(2)
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_target, args=(there, hugepages))
    proc.start()
    try:
        info = here.recv()
        source = _zeros(hugepages)
        source.copy_(torch.randn(SHAPE))
        agent = KVTransferAgent(new_agent_name("prefill"), source)
        agent.connect(info)
        src, dst = [0, 1, 2, 7, 5], [3, 4, 5, 9, 0]
        transfer = agent.write_blocks(info.name, src, dst)
        assert transfer.num_descs == 3 and transfer.num_blocks == 5
        while agent.poll(transfer) == "PROC":
            time.sleep(0.001)
        assert transfer.state == "DONE"
        agent.notify(info.name, b"done")
        notes, raw = here.recv()
    finally:
        proc.join(HANG_S)
    assert notes == [b"done"]
    received = torch.frombuffer(bytearray(raw), dtype=torch.float32).view(SHAPE)
    expected = torch.zeros(SHAPE)
    expected[dst] = source[src]
    assert torch.equal(received.view(torch.int32), expected.view(torch.int32))
