"""Failures in a simulated deployment, handled by the decode node's real fail-over code
(`PrefillFailover` with `DecodeOptions`, which `DecodeNode` runs too) on the real
scheduler: a prefill worker that dies, one that restarts, prefill deadlines, client aborts.
After each, every request has an outcome, every KV block is accounted for
(`check_integrity()`), and no hold outlives the run."""

from __future__ import annotations

import pytest

from tandem.engine.transfer.prefill_failover import ABORT_RESEND_S
from tandem.sim.cluster import Cluster, ClusterConfig, RequestRecord
from tandem.sim.faults import Faults, Outage
from tandem.sim.profiles import load_profile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import SHAPES
from tandem.sim.workload import synthetic

SHAPE = SHAPES["llama-3-8b"]
H100 = load_profile("h100")
# Long prompts at a high rate: remote prefills are in flight whenever a worker dies.
REQUESTS = synthetic(160, 40.0, (1500, 3000), (20, 60), SHAPE.vocab_size, seed=11)


def run(config: ClusterConfig, faults: Faults) -> tuple[Cluster, list[RequestRecord]]:
    cluster = Cluster(config, SHAPE, H100, faults=faults)
    records = cluster.run(REQUESTS)
    assert_clean(cluster, records)
    return cluster, records


def assert_clean(cluster: Cluster, records: list[RequestRecord]) -> None:
    """Every request ended; no live node has a request, a stream, a block in use or a
    hold; the router counts nothing in flight."""
    assert all(r.outcome in ("finished", "aborted", "error") for r in records)
    assert all((r.finish_s is not None) == (r.outcome == "finished") for r in records)
    cluster.check_integrity()
    for node in cluster.nodes.values():
        if node.dead:
            continue
        assert not node.scheduler.requests
        assert node.kv.pool.check_integrity().in_use == 0
        assert not node.kv.hold_keys()
    for d in cluster.decodes:
        if d.dead:
            continue
        assert not d.streams and not d.failover.attempts
        assert not d.failover.unconfirmed and not d.failover.hold_deadlines
    assert all(w.inflight == 0 for w in cluster.router.pool.workers.values())
    assert cluster.num_held_blocks == 0


def failures(cluster: Cluster, records: list[RequestRecord]) -> dict:
    return summarize(cluster, records, SLO())["failures"]


def test_a_dead_prefill_worker_makes_its_requests_prefill_locally():
    config = ClusterConfig(num_prefill=1, num_decode=2, hold_timeout_s=5.0)
    cluster, records = run(config, Faults(outages=(Outage(0, 0.5),)))
    f = failures(cluster, records)
    assert all(r.outcome == "finished" for r in records)
    hit = [r for r in records if "disconnected" in r.fallbacks]
    assert hit and all(r.remote is False for r in hit)  # recomputed on the decode node
    assert f["fallbacks"]["disconnected"] == len(hit)
    # sent before the router ejected the worker (the connection was known down): unreachable
    assert f["fallbacks"].get("unreachable", 0) >= 1
    # never confirmed by a worker that stays dead: the holds ended by their timeout
    assert f["hold_timeouts"] >= len(hit) and f["held_blocks_at_end"] == 0
    # once ejected, the router stops naming it: later requests are never sent remote
    late = [r for r in records if r.arrival_s > 2.1]  # ejected at the 2nd round, t = 2 s
    assert late and all(r.prefill is None and not r.fallbacks for r in late)
    assert not cluster.router.pool.workers[cluster.prefills[0].url].healthy


def test_a_restarted_worker_confirms_the_aborts_and_serves_again():
    config = ClusterConfig(num_prefill=1, num_decode=2, hold_timeout_s=1000.0)
    outage = Outage(0, 0.5, restart_after_s=0.5)
    cluster, records = run(config, Faults(outages=(outage,)))
    f = failures(cluster, records)
    assert f["prefill_deaths"] == 1 and f["prefill_restarts"] == 1
    assert f["fallbacks"]["disconnected"] >= 1
    # its successor knows none of the old attempts and confirms their aborts at once
    assert f["hold_timeouts"] == 0 and f["held_blocks_at_end"] == 0
    back = [r for r in records if r.arrival_s > 2.5]
    assert back and all(r.remote and not r.fallbacks for r in back)
    assert cluster.retired and cluster.prefills[0].agent != cluster.retired[0].agent


def test_the_aborts_are_resent_and_the_restarted_worker_frees_the_holds_within_a_period():
    """The decode nodes' real `PrefillFailover` sends aborts that find the worker down, then
    resends them every `ABORT_RESEND_S` on the simulated clock: the holds of the attempts
    that died with the worker are all released within one resend period of its restart."""
    kill_s, restart_after_s = 0.5, 0.7
    config = ClusterConfig(num_prefill=1, num_decode=2, hold_timeout_s=1000.0)
    cluster = Cluster(
        config, SHAPE, H100, faults=Faults(outages=(Outage(0, kill_s, restart_after_s),))
    )
    released: list[tuple[float, str]] = []
    for d in cluster.decodes:
        release = d.failover.release

        def logged(key: str, release=release) -> None:
            released.append((cluster.events.now, key))
            release(key)

        d.failover.release = logged
    records = cluster.run(REQUESTS)
    assert_clean(cluster, records)
    hit = {r.request_id for r in records if "disconnected" in r.fallbacks}
    died = [(t, key) for t, key in released if key.split("@")[0] in hit and key.endswith("@1")]
    assert hit and len(died) >= len(hit)
    restart_s = kill_s + restart_after_s
    # nobody confirms while the worker is down; its successor confirms the next resend
    assert all(t > restart_s for t, _ in died)
    hops = 4 * H100.network_latency_s  # connect, abort, confirmation, and a step's wait
    assert max(t for t, _ in died) <= restart_s + ABORT_RESEND_S + hops + 0.1
    assert cluster.num_hold_timeouts == 0


def test_with_on_prefill_failure_fail_the_router_retries_then_the_requests_end_in_error():
    """The decode node's error record says the prefill failed (`error_source: prefill`):
    the router retries on the other decode worker without ejecting the first
    (`Dispatcher.on_failure`), and ends the request once no decode worker is left."""
    config = ClusterConfig(
        num_prefill=1, num_decode=2, on_prefill_failure="fail", hold_timeout_s=5.0
    )
    cluster, records = run(config, Faults(outages=(Outage(0, 0.5),)))
    errors = [r for r in records if r.outcome == "error"]
    assert errors and all(r.fallbacks and r.first_token_s is None for r in errors)
    # failed on both decode workers, then none was left to try: 503
    assert all(r.worker_failures == ["prefill_failed"] * 2 for r in errors)
    assert all(r.error == "unavailable" for r in errors)
    f = failures(cluster, records)
    assert f["errors"] == len(errors)
    assert f["router_retries"]["prefill_failed"] >= 2 * len(errors)
    assert "decode_failed" not in f["router_retries"]
    assert all(cluster.router.pool.workers[d.url].healthy for d in cluster.decodes)
    assert all(r.outcome == "finished" for r in records if not r.fallbacks)


def test_a_second_prefill_worker_takes_the_retry():
    config = ClusterConfig(num_prefill=2, num_decode=2, hold_timeout_s=5.0)
    _, records = run(config, Faults(outages=(Outage(0, 0.5),)))
    retried = [r for r in records if r.fallbacks == ["disconnected"]]
    # one retry on the alternate, which succeeds: still prefilled remotely
    assert retried and all(r.remote and r.outcome == "finished" for r in retried)
    assert all(len(r.fallbacks) <= 2 for r in records)


def test_a_prefill_deadline_falls_back_and_the_late_attempt_is_confirmed():
    # no prompt can be prefilled remotely in 5 ms: every attempt times out, the first on
    # one worker and the retry on the other, then the decode node prefills it
    config = ClusterConfig(num_prefill=2, num_decode=1, prefill_timeout_s=0.005)
    cluster, records = run(config, Faults())
    assert all(r.outcome == "finished" and r.remote is False for r in records)
    assert all(r.fallbacks == ["timeout", "timeout"] for r in records)
    f = failures(cluster, records)
    assert f["fallbacks"] == {"timeout": 2 * len(records)}
    assert f["hold_timeouts"] == 0  # every abandoned attempt was confirmed by its worker
    assert sum(p.num_blocks_sent for p in cluster.prefills) < sum(
        -(-r.num_prompt_tokens // 16) for r in records
    )  # deadlines stop writes


@pytest.mark.parametrize("num_prefill", [0, 1])
def test_aborted_requests_end_and_free_their_blocks(num_prefill):
    faults = Faults(abort_share=0.5, abort_after_s=0.3, seed=4)
    cluster, records = run(ClusterConfig(num_prefill=num_prefill, num_decode=1), faults)
    aborted = [r for r in records if r.outcome == "aborted"]
    chosen = faults.aborted([r.request_id for r in records])
    assert aborted and {r.request_id for r in aborted} <= chosen
    assert all(r.ended_s == pytest.approx(r.arrival_s + 0.3) for r in aborted)
    # a chosen request that finished before its client gave up is not aborted
    assert all(r.outcome == "finished" for r in records if r.request_id not in chosen)
    s = summarize(cluster, records, SLO())
    assert s["failures"]["aborted"] == len(aborted)
    assert s["num_finished"] == len(records) - len(aborted)
    assert s["failures"]["hold_timeouts"] == 0


def test_a_run_with_failures_is_deterministic_for_a_seed():
    config = ClusterConfig(num_prefill=2, num_decode=2, hold_timeout_s=5.0)
    outages = (Outage(0, 0.4, restart_after_s=0.3), Outage(1, 1.2))

    def outcome(seed: int) -> list[tuple]:
        _, records = run(
            config, Faults(abort_share=0.3, abort_after_s=0.2, outages=outages, seed=seed)
        )
        return [(r.request_id, r.outcome, r.first_token_s, tuple(r.fallbacks)) for r in records]

    first = outcome(1)
    assert outcome(1) == first
    assert outcome(2) != first


def test_bad_faults_are_refused():
    with pytest.raises(ValueError, match="WORKER@SECONDS"):
        Outage.parse("zero@1")
    assert Outage.parse("1@2.5+3") == Outage(1, 2.5, 3.0)
    with pytest.raises(ValueError, match="abort_share"):
        Faults(abort_share=1.5)
    with pytest.raises(ValueError, match="on_prefill_failure"):
        ClusterConfig(on_prefill_failure="retry")
    cluster = Cluster(
        ClusterConfig(num_prefill=1), SHAPE, H100, faults=Faults(outages=(Outage(3, 1.0),))
    )
    with pytest.raises(ValueError, match="there are 1"):
        cluster.run(REQUESTS[:2])
