"""Whole simulated deployments: every request ends, every KV block is accounted for, and
the real scheduler's and router's decisions show in the outcome."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.engine.core.config import LAST_WRITE_WAIT_SHARE
from tandem.sim.cluster import Cluster, ClusterConfig
from tandem.sim.faults import Faults
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import SHAPES
from tandem.sim.step_model import StepShape, StepTimeModel
from tandem.sim.transfer_model import TransferModel
from tandem.sim.workload import SimRequest, synthetic

SHAPE = SHAPES["llama-3-8b"]
H100 = load_profile("h100")


def families(num_families: int, per_family: int, gap_s: float) -> list[SimRequest]:
    """Prompts of 96 shared tokens (one family each) plus 40 of their own, interleaved."""
    out = []
    for _ in range(per_family):
        for f in range(num_families):
            n = len(out)
            segments = (f, 1000 + n)  # 96-token shared segment, then a private one
            out.append(SimRequest(f"r{n}", n * gap_s, 136, 8, segments, 96, SHAPE.vocab_size))
    return out


def run(config: ClusterConfig, requests) -> tuple[Cluster, list]:
    cluster = Cluster(config, SHAPE, H100)
    records = cluster.run(requests)
    cluster.check_integrity()
    return cluster, records


def test_every_request_finishes_with_its_tokens_and_runs_are_deterministic():
    config = ClusterConfig(num_prefill=2, num_decode=3, num_kv_blocks=400, max_model_len=4096)
    reqs = synthetic(300, 50.0, (16, 700), (1, 40), SHAPE.vocab_size, shared_prefix_tokens=64)
    cluster, records = run(config, reqs)
    assert len(records) == 300 and all(r.finish_s is not None for r in records)
    assert all(r.arrival_s < r.first_token_s <= r.finish_s for r in records)
    for node in cluster.nodes.values():
        assert not node.scheduler.requests and not node.kv.hold_keys()
        assert all(w.inflight == 0 for w in cluster.router.pool.workers.values())
    _, again = run(config, reqs)
    assert [(r.decode, r.first_token_s, r.num_cached_tokens) for r in records] == [
        (r.decode, r.first_token_s, r.num_cached_tokens) for r in again
    ]


@pytest.mark.parametrize(
    ("num_prefill", "threshold", "remote"), [(1, 0, True), (1, 10_000, False), (0, 0, False)]
)
def test_the_remote_prefill_decision_follows_the_threshold(num_prefill, threshold, remote):
    config = ClusterConfig(
        num_prefill=num_prefill, num_decode=1, remote_prefill_threshold=threshold
    )
    cluster, records = run(config, families(2, 3, gap_s=1.0))
    assert {r.remote for r in records} == {remote}
    moved = summarize(cluster, records, SLO())["kv_transfer"]
    if remote:
        blocks = sum(-(-r.num_prompt_tokens // 16) - r.num_cached_tokens // 16 for r in records)
        assert moved["blocks"] == blocks
        assert moved["bytes"] == blocks * cluster.prefills[0].transfer.block_bytes
    else:
        assert moved["bytes"] == 0


def test_a_repeated_prefix_is_reused_by_the_decode_node_after_a_remote_prefill():
    _, records = run(ClusterConfig(num_prefill=1, num_decode=1), families(1, 3, 1.0))
    # 96 shared tokens are 6 full blocks; the first request finds none
    assert [r.num_cached_tokens for r in records] == [0, 96, 96]
    assert records[1].remote and records[1].num_prefill_cached_tokens == 96


def test_prefix_aware_routing_reuses_more_than_round_robin():
    reqs = families(6, 8, gap_s=0.5)
    hits = {}
    for policy in ("round-robin", "prefix-aware", "kv-aware"):
        config = ClusterConfig(num_prefill=0, num_decode=4, policy=policy)
        _, records = run(config, reqs)
        hits[policy] = sum(r.num_cached_tokens for r in records)
    assert hits["prefix-aware"] > hits["round-robin"]
    assert hits["kv-aware"] > hits["round-robin"]
    # with routing by prefix only each family's first request misses
    assert hits["prefix-aware"] == (len(reqs) - 6) * 96


def test_a_small_cache_preempts_and_still_finishes_everything():
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=40, max_model_len=600)
    reqs = synthetic(60, 200.0, (100, 300), (50, 200), SHAPE.vocab_size, seed=3)
    cluster, records = run(config, reqs)
    assert all(r.finish_s is not None for r in records)
    assert sum(n.scheduler.num_preemptions for n in cluster.decodes) > 0


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="unknown policy"):
        Cluster(ClusterConfig(policy="random"), SHAPE, H100)


@pytest.mark.parametrize(
    "sliced", [{}, {"host_time_slice_s": 0.003, "host_decode_run_s": 0.001}], ids=["even", "sliced"]
)
def test_nodes_sharing_host_cores_take_longer_than_nodes_with_devices_of_their_own(sliced):
    reqs = synthetic(40, 100.0, (200, 400), (5, 20), SHAPE.vocab_size, seed=5)
    config = ClusterConfig(num_prefill=2, num_decode=2)
    ttft = {}
    for cores, background in ((0, 0.0), (1, 0.0), (1, 2.0)):
        profile = dataclasses.replace(
            H100, host_cores=cores, host_background_load=background, **sliced
        )
        cluster = Cluster(config, SHAPE, profile)
        records = cluster.run(reqs)
        ttft[cores, background] = sum(r.first_token_s - r.arrival_s for r in records)
        assert cluster.cores.num_stepping == 0
        assert all(r.outcome == "finished" for r in records)
        cluster.check_integrity()
    # other tenants' threads on the same core slow every step further
    assert ttft[1, 2.0] > ttft[1, 0.0] > ttft[0, 0.0]


def test_relaying_on_the_same_host_takes_the_cores_when_tokens_flow():
    reqs = synthetic(40, 100.0, (200, 400), (5, 20), SHAPE.vocab_size, seed=5)
    config = ClusterConfig(num_prefill=1, num_decode=1)
    e2e = {}
    relay_fields = [
        f"{p}_{k}" for p in ("router", "client") for k in ("request", "finish", "token")
    ]
    for relay in (0.0, 0.01):
        costs = {f"host_{name}_s": relay for name in relay_fields}
        profile = dataclasses.replace(H100, host_cores=1, **costs)
        cluster = Cluster(config, SHAPE, profile)
        records = cluster.run(reqs)
        e2e[relay] = sum(r.finish_s - r.arrival_s for r in records)
        assert cluster.cores.num_stepping == 0  # every process's work ended
        assert all(r.outcome == "finished" for r in records)
    assert e2e[0.01] > e2e[0.0]
    # with devices of their own the router and clients take no node's time
    own = dataclasses.replace(H100, **{f"host_{name}_s": 0.01 for name in relay_fields})
    with_relay = Cluster(config, SHAPE, own).run(reqs)
    without = Cluster(config, SHAPE, H100).run(reqs)
    assert [r.finish_s for r in with_relay] == [r.finish_s for r in without]


@pytest.mark.parametrize(
    ("field", "num_decode", "process"),
    [
        ("host_router_request_s", 2, lambda c: c.router_process),
        ("host_decode_request_s", 1, lambda c: c.decodes[0].front),
    ],
    ids=["router", "decode-node-http"],
)
def test_a_single_threaded_process_takes_a_burst_one_request_after_the_other(
    field, num_decode, process
):
    # Eight requests arrive at the same instant on a host of two cores: the router's event
    # loop parses them in turn (20 ms each), and so does the only decode node's HTTP thread
    # before its engine sees them, so the k-th is admitted no earlier than (k+1) x 20 ms
    # after the burst; as tasks side by side they all left together.
    config = ClusterConfig(num_prefill=1, num_decode=num_decode, num_kv_blocks=256)
    reqs = [SimRequest.of_tokens(f"r{i}", 1.0, [5 + i] * 64, 2) for i in range(8)]
    profile = dataclasses.replace(H100, host_cores=2, **{field: 0.02})
    cluster = Cluster(config, SHAPE, profile)
    records = cluster.run(reqs)
    admitted = sorted(r.admitted_s - r.arrival_s for r in records)
    for k, delay in enumerate(admitted):
        assert delay >= (k + 1) * 0.02 - 1e-9
    assert process(cluster).busy_s == pytest.approx(8 * 0.02)
    assert all(r.outcome == "finished" for r in records)
    # with cores of their own (no host simulated) the work costs nothing
    own = dataclasses.replace(H100, **{field: 0.02})
    assert [r.admitted_s for r in Cluster(config, SHAPE, own).run(reqs)] == [
        r.admitted_s for r in Cluster(config, SHAPE, H100).run(reqs)
    ]


def test_the_router_routes_a_burst_before_it_forwards_any_of_it():
    # Four requests reach the router together; it parses each (10 ms) and routes it, and
    # writes it to its decode node in a later turn (5 ms), behind the parsing of the rest:
    # no request reaches a decode node before the last one is routed, so every decision
    # sees the others only as the router's own in-flight counts, and they alternate.
    config = ClusterConfig(num_prefill=1, num_decode=2, num_kv_blocks=256)
    reqs = [SimRequest.of_tokens(f"r{i}", 1.0, [5 + i] * 64, 2) for i in range(4)]
    work = {"host_router_request_s": 0.01, "host_router_forward_s": 0.005}
    cluster = Cluster(config, SHAPE, dataclasses.replace(H100, host_cores=4, **work))
    records = cluster.run(reqs)
    first_admitted = min(r.admitted_s for r in records) - 1.0
    assert first_admitted >= 4 * 0.01 + 0.005 - 1e-9
    assert cluster.router_process.busy_s == pytest.approx(4 * 0.015)
    assert [r.decode for r in records[:2]] == [r.decode for r in records[2:]]
    assert len({r.decode for r in records}) == 2
    assert all(r.outcome == "finished" for r in records)


def step_starts(cluster: Cluster) -> list[float]:
    """The simulated times the prefill worker's steps start, as the run goes."""
    node, starts = cluster.prefills[0], []
    run_step = node._run_step

    def timed() -> None:
        num_steps = node.num_steps
        run_step()
        if node.num_steps > num_steps:  # not an idle turn
            starts.append(cluster.events.now)

    node._run_step = timed
    return starts


@pytest.mark.parametrize("kv_link_bandwidth", [50e9, 2e9])
def test_a_busy_prefill_worker_waits_a_bounded_time_for_a_finished_job_s_last_write(
    kv_link_bandwidth: float,
):
    # Two prompts of one step each arrive together at the only prefill worker. After the
    # first one's step its write is in flight and the second one's step is due: the worker
    # waits for the write (as PrefillNode.step does) and notifies at once, but for at
    # most LAST_WRITE_WAIT_SHARE of a step. Fast link: the second step starts when the
    # write lands, and the first token comes before that step ends (it used to come after
    # it). Slow link: the second step starts once the wait's bound has passed.
    config = ClusterConfig(
        num_prefill=1, num_decode=1, num_kv_blocks=64, max_num_batched_tokens=256,
        max_model_len=1024,
    )  # fmt: skip
    profile = dataclasses.replace(H100, kv_link_bandwidth=kv_link_bandwidth)
    reqs = [SimRequest.of_tokens(f"r{i}", 0.0, [3 + i] * 256, 2) for i in range(2)]
    cluster = Cluster(config, SHAPE, profile)
    starts = step_starts(cluster)
    records = cluster.run(reqs)
    cluster.check_integrity()
    step = StepTimeModel(SHAPE, profile, role="prefill").step_time(StepShape.of([256], [256], 1))
    write = TransferModel(SHAPE, profile, config.block_size).write_time(16, 1)
    bound = LAST_WRITE_WAIT_SHARE * step
    first = min(records, key=lambda r: r.first_token_s)
    assert [r.remote for r in records] == [True, True]
    assert len(starts) == 2 and cluster.prefills[0].num_steps == 2
    if write < bound:
        assert starts[1] - starts[0] == pytest.approx(step + write)
        assert first.first_token_s < starts[1] + step
    else:
        assert starts[1] - starts[0] == pytest.approx(step + bound)
        assert first.first_token_s > starts[0] + step + write  # waited for its write only


def test_the_router_s_phases_split_a_remote_prefill_as_the_real_router_does():
    # Two one-step prompts, the second a quarter of a step later, at the only prefill
    # worker. The first one's remote_prefill is its step (received -> first token sampled).
    # The second one's request waits in the worker's socket while that step runs, which
    # `ChoiceClock.phases` counts in kv_transfer; its remote_prefill is the worker's wait
    # for the first one's write (before its step, as PrefillNode.step waits) and its step.
    config = ClusterConfig(
        num_prefill=1, num_decode=1, num_kv_blocks=64, max_num_batched_tokens=256,
        max_model_len=1024,
    )  # fmt: skip
    step = StepTimeModel(SHAPE, H100, role="prefill").step_time(StepShape.of([256], [256], 1))
    write = TransferModel(SHAPE, H100, config.block_size).write_time(16, 1)
    reqs = [SimRequest.of_tokens(f"r{i}", i * step / 4, [3 + i] * 256, 4) for i in range(2)]
    cluster, records = run(config, reqs)
    assert [set(r.phases) for r in records] == [
        {"queue", "remote_prefill", "kv_transfer", "other", "first_decode", "decode"}
    ] * 2
    first, second = records
    assert first.phases["remote_prefill"] == pytest.approx(step)
    assert second.phases["remote_prefill"] == pytest.approx(write + step)
    assert first.phases["kv_transfer"] < step / 2 < second.phases["kv_transfer"]
    for r in records:  # the phases before the first token add up to it, at the router
        before = sum(r.phases[p] for p in ("queue", "remote_prefill", "kv_transfer", "other"))
        assert before < r.first_token_s - r.arrival_s
    means = summarize(cluster, records, SLO())["phase_mean_s"]
    assert means["remote_prefill"] == pytest.approx(step + write / 2)


def never_forwarded(records: list) -> list:
    return [r for r in records if not r.decode]


def never_admitted(records: list) -> list:
    return [r for r in records if r.decode and r.admitted_s is None]


@pytest.mark.parametrize(
    ("field", "stuck"),
    [("host_router_request_s", never_forwarded), ("host_decode_request_s", never_admitted)],
    ids=["in-the-router", "in-the-decode-node-http-thread"],
)
def test_a_client_that_goes_away_while_its_request_waits_in_a_single_threaded_process(field, stuck):
    # The router (or the decode node's HTTP thread) takes 50 ms per request; every client
    # gives up 0.12 s after it sent: of eight requests that arrive together the last ones
    # are still queued there then, end aborted and never reach a node's engine; nothing is
    # left in the node, held or counted in flight.
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=256)
    reqs = [SimRequest.of_tokens(f"r{i}", 0.0, [5 + i] * 64, 50) for i in range(8)]
    profile = dataclasses.replace(H100, host_cores=2, **{field: 0.05})
    cluster = Cluster(config, SHAPE, profile, faults=Faults(abort_share=1.0, abort_after_s=0.12))
    records = cluster.run(reqs)
    assert stuck(records) and all(r.outcome == "aborted" for r in stuck(records))
    assert all(r.outcome in ("aborted", "finished") for r in records)
    assert not cluster.decodes[0].streams  # no request left in the node
    cluster.check_integrity()
    assert cluster.num_held_blocks == 0
    assert all(w.inflight == 0 for w in cluster.router.pool.workers.values())


@pytest.mark.parametrize(("gap_steps", "batches"), [(0.0, {2: 1}), (2.0, {1: 2})])
def test_a_prefill_worker_batches_the_prompts_that_reach_it_together(gap_steps, batches):
    # Two prompts at the only prefill worker: together, they share its one step; two steps
    # apart, each has a step of its own. The pool summary counts the same.
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=64, max_model_len=1024)
    step = StepTimeModel(SHAPE, H100, role="prefill").step_time(StepShape.of([256], [256], 1))
    reqs = [SimRequest.of_tokens(f"r{i}", i * gap_steps * step, [3 + i] * 256, 2) for i in range(2)]
    cluster, records = run(config, reqs)
    assert dict(cluster.prefills[0].batch_sizes) == batches
    pool = summarize(cluster, records, SLO())["pools"]["prefill"]
    assert pool["steps"] == sum(batches.values())
    assert pool["steps_of_one"] == batches.get(1, 0)
    assert pool["batch_mean"] == 2 / pool["steps"]


def test_the_pool_summary_counts_the_requests_that_wait_through_each_step():
    # Two 2048-token prompts reach the only prefill worker together; the step budget holds
    # one: the second waits through the first's step, then runs alone. The worker's waiting
    # count (`tandem_num_requests_waiting`) is 1 for one step's time and 0 after.
    config = ClusterConfig(num_prefill=1, num_decode=1, num_kv_blocks=512, max_model_len=4096)
    step = StepTimeModel(SHAPE, H100, role="prefill").step_time(StepShape.of([2048], [2048], 1))
    reqs = [SimRequest.of_tokens(f"r{i}", 0.0, [3 + i] * 2048, 2) for i in range(2)]
    cluster, records = run(config, reqs)
    prefill = cluster.prefills[0]
    assert dict(prefill.batch_sizes) == {1: 2}
    assert prefill.waiting_s == pytest.approx(step)
    summary = summarize(cluster, records, SLO())
    assert summary["pools"]["prefill"]["waiting_mean"] == pytest.approx(
        step / summary["duration_s"]
    )
