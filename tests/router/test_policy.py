"""Routing policies on synthetic snapshots: pure functions, so every case is exact."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tandem.router.policy import (
    POLICIES,
    RouteRequest,
    Snapshot,
    kv_aware,
    least_load,
    prefix_aware,
    round_robin,
)
from tandem.router.workers import WorkerView


def view(url: str, role: str, revision: str = "r1", **kw) -> WorkerView:
    endpoint = f"tcp://{url}" if role == "prefill" else None
    return WorkerView(url, role, revision, endpoint, total_blocks=100, free_blocks=100, **kw)


P = (view("p0", "prefill"), view("p1", "prefill"), view("p2", "prefill"))
D = (view("d0", "decode"), view("d1", "decode"))
REQ = RouteRequest(seq=0, num_blocks=8, num_tokens=130)


def test_round_robin_cycles_through_workers_in_order():
    snap = Snapshot(P, D)
    picks = [round_robin(snap, replace(REQ, seq=s)) for s in range(6)]
    assert [r.decode.url for r in picks] == ["d0", "d1"] * 3
    assert [r.prefill.url for r in picks] == ["p0", "p1", "p2"] * 2


def test_least_load_picks_fewest_pending_and_uses_the_fresher_count():
    prefill = (view("p0", "prefill", running=3), view("p1", "prefill", inflight=1))
    decode = (view("d0", "decode", waiting=2), view("d1", "decode", inflight=5, running=1))
    route = least_load(Snapshot(prefill, decode), REQ)
    assert (route.prefill.url, route.decode.url) == ("p1", "d0")
    assert [a.url for a in route.alternates] == ["p0"]


def test_least_load_ties_rotate_with_the_request_number():
    snap = Snapshot(P, D)
    firsts = {least_load(snap, replace(REQ, seq=s)).prefill.url for s in range(3)}
    assert firsts == {"p0", "p1", "p2"}


def test_prefix_aware_prefers_the_longest_cached_prefix_then_load():
    prefill = (
        view("p0", "prefill", overlap_blocks=2),
        view("p1", "prefill", overlap_blocks=6, running=4),
        view("p2", "prefill", overlap_blocks=6, running=1),
    )
    route = prefix_aware(Snapshot(prefill, D), REQ)
    assert route.prefill.url == "p2"
    assert [a.url for a in route.alternates] == ["p1", "p0"]


def test_kv_aware_trades_cached_prefix_against_queue():
    # p0 has the whole prompt but 2 requests queued (cost 0 + 2*8 = 16);
    # p1 has nothing cached and an empty queue (cost 8): p1 wins.
    prefill = (view("p0", "prefill", overlap_blocks=8, waiting=2), view("p1", "prefill"))
    assert kv_aware(Snapshot(prefill, D), REQ).prefill.url == "p1"
    # with half the prompt cached and nothing queued, p0 (cost 4) beats p1 (cost 8)
    prefill = (view("p0", "prefill", overlap_blocks=4), view("p1", "prefill"))
    assert kv_aware(Snapshot(prefill, D), REQ).prefill.url == "p0"


def test_kv_aware_weighs_a_cached_prefix_against_the_blocks_a_decode_worker_holds():
    # d0 has the whole prompt cached (0 to receive) but its requests hold 20 blocks: 20;
    # d1 holds nothing and must receive all 8: d1 wins, whatever d0's request count
    decode = (
        replace(view("d0", "decode", overlap_blocks=8, running=2), free_blocks=80),
        view("d1", "decode"),
    )
    assert kv_aware(Snapshot(P, decode), REQ).decode.url == "d1"
    # holding 5 blocks, d0 (cost 5) beats d1 (cost 8)
    decode = (replace(decode[0], free_blocks=95), decode[1])
    assert kv_aware(Snapshot(P, decode), REQ).decode.url == "d0"
    # the node's count lags: the router's 2 requests there count at this prompt's size (16)
    decode = (replace(decode[0], inflight=2), decode[1])
    assert kv_aware(Snapshot(P, decode), REQ).decode.url == "d1"


def test_kv_aware_avoids_a_decode_worker_without_room():
    decode = (
        replace(view("d0", "decode"), free_blocks=3),  # the prompt needs 130 // 16 + 1 = 9
        view("d1", "decode", running=20),
    )
    assert kv_aware(Snapshot(P, decode), REQ).decode.url == "d1"
    # when nobody has room, the least bad one still gets it (it will queue there)
    full = tuple(replace(d, free_blocks=0) for d in D)
    assert kv_aware(Snapshot(P, full), REQ).decode is not None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_prefill_is_paired_only_within_the_decode_workers_revision(name):
    prefill = (view("p-old", "prefill", "old"), view("p-new", "prefill", "new"))
    decode = (view("d-new", "decode", "new"),)
    route = POLICIES[name](Snapshot(prefill, decode), REQ)
    assert route.prefill.url == "p-new" and route.alternates == ()
    # a revision without prefill workers: the decode node prefills locally
    route = POLICIES[name](Snapshot(prefill[:1], decode), REQ)
    assert route.decode.url == "d-new" and route.prefill is None


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_no_decode_worker_means_no_route(name):
    assert POLICIES[name](Snapshot(P, ()), REQ) is None
