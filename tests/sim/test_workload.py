"""Workloads: trace readers keep real prefix sharing, synthetic and scaled loads. The traces
themselves are not in the repository: these tests write small files in both formats."""

from __future__ import annotations

import json

import pytest

from tandem.sim.traces import read_trace
from tandem.sim.workload import fit_lengths, scale_load, synthetic


def _mooncake(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_equal_mooncake_hash_ids_are_equal_tokens_and_others_differ(tmp_path):
    path = _mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
            {"timestamp": 500, "input_length": 1200, "output_length": 7, "hash_ids": [0, 1, 2]},
            {"timestamp": 900, "input_length": 600, "output_length": 9, "hash_ids": [3, 4]},
        ],
    )
    a, b, c = read_trace(path, vocab_size=1000)
    ta, tb, tc = a.token_ids(), b.token_ids(), c.token_ids()
    assert (len(ta), len(tb), len(tc)) == (1000, 1200, 600)
    assert tb[:1000] == ta  # hash ids 0, 1: the same 1,024 tokens, cut at 1,000
    assert tc[:512] != ta[:512]
    assert (a.arrival_s, b.arrival_s, c.arrival_s) == (0.0, 0.5, 0.9)
    assert all(0 <= t < 1000 for t in tb)
    assert read_trace(path, vocab_size=1000)[1].token_ids() == tb  # deterministic


def test_a_length_scale_shrinks_blocks_and_keeps_the_sharing(tmp_path):
    path = _mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1024, "output_length": 40, "hash_ids": [7, 8]},
            {"timestamp": 1, "input_length": 1024, "output_length": 40, "hash_ids": [7, 9]},
        ],
    )
    a, b = read_trace(path, vocab_size=500, length_scale=8)
    assert (a.num_prompt_tokens, a.num_output_tokens, a.segment_tokens) == (128, 5, 64)
    assert a.token_ids()[:64] == b.token_ids()[:64]
    assert a.token_ids()[64:] != b.token_ids()[64:]


def test_azure_rows_give_arrivals_and_lengths_and_share_nothing(tmp_path):
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    a, b = read_trace(path, vocab_size=1000)
    assert (a.num_prompt_tokens, a.num_output_tokens) == (374, 44)
    assert b.arrival_s == pytest.approx(4.314579, abs=1e-6)
    assert a.token_ids()[:16] != b.token_ids()[:16]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n")
    with pytest.raises(ValueError, match="not an Azure trace row"):
        read_trace(path, vocab_size=1000)
    with pytest.raises(ValueError, match="unknown trace format"):
        read_trace(tmp_path / "x.txt", vocab_size=1000)


def test_synthetic_load_scaling_and_fitting():
    reqs = synthetic(200, 10.0, (20, 40), (1, 8), 1000, shared_prefix_tokens=32, seed=1)
    assert all(20 <= r.num_prompt_tokens <= 40 and 1 <= r.num_output_tokens <= 8 for r in reqs)
    assert reqs[0].token_ids()[:32] == reqs[1].token_ids()[:32]
    assert reqs[0].token_ids()[32:] != reqs[1].token_ids()[32:]
    span = reqs[-1].arrival_s - reqs[0].arrival_s
    assert 200 / span == pytest.approx(10.0, rel=0.25)
    faster = scale_load(reqs, 2.0)
    assert faster[-1].arrival_s == pytest.approx(reqs[-1].arrival_s / 2)
    fitted = fit_lengths(reqs, 30)
    assert all(r.num_prompt_tokens + r.num_output_tokens <= 30 for r in fitted)
    assert fitted[0].token_ids() == reqs[0].token_ids()[: fitted[0].num_prompt_tokens]
