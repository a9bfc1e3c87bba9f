"""Decode workers that die in a simulated deployment, handled by the router's real policy
(`Dispatcher.on_failure` on the real `WorkerPool`): a request that had streamed no token is
retried on another decode worker, one that had ends with an error (`StreamBroken`); the
dead worker is ejected at its first broken stream; prefill jobs writing into it end without
leaking a block; a restarted worker rejoins. Simulated time only."""

from __future__ import annotations

import pytest

from tandem.sim.cluster import Cluster, ClusterConfig, RequestRecord
from tandem.sim.faults import Faults, Outage
from tandem.sim.router import decode_url
from tests.sim.test_failures import H100, REQUESTS, SHAPE, assert_clean, failures, run

KILL_S = 0.5
HOP_S = H100.network_latency_s
DEAD, SURVIVOR = decode_url(0), decode_url(1)


def kill_decode(restart_after_s: float | None = None) -> Faults:
    return Faults(outages=(Outage(0, KILL_S, restart_after_s, role="decode"),))


def hit(records: list[RequestRecord]) -> list[RequestRecord]:
    """The requests a decode worker's death failed at least once."""
    return [r for r in records if "decode_failed" in r.worker_failures]


def test_a_dead_decode_worker_s_requests_are_retried_before_their_first_token_else_fail():
    cluster, records = run(ClusterConfig(num_prefill=1, num_decode=2), kill_decode())
    f = failures(cluster, records)
    lost = hit(records)
    retried = [r for r in lost if r.outcome == "finished"]
    broken = [r for r in lost if r.outcome == "error"]
    assert retried and broken and len(retried) + len(broken) == len(lost)
    # streamed a token before the router heard of the death: the stream ends in error
    assert all(r.error == "stream_broken" for r in broken)
    assert all(r.first_token_s <= KILL_S + HOP_S for r in broken)
    assert all(r.worker_failures == ["decode_failed"] for r in lost)
    # no token yet: retried once, on the survivor, where it finished
    assert all(r.decode == SURVIVOR and r.first_token_s > KILL_S + HOP_S for r in retried)
    assert f["router_retries"] == {"decode_failed": len(retried)}
    assert f["decode_death_outcomes"] == {"error": len(broken), "finished": len(retried)}
    assert f["errors"] == len(broken) and f["decode_deaths"] == 1
    # every other request finished untouched
    assert all(r.outcome == "finished" and not r.worker_failures for r in records if r not in lost)


def test_the_dead_worker_is_ejected_and_later_requests_go_to_the_survivor():
    cluster, records = run(ClusterConfig(num_prefill=1, num_decode=2), kill_decode())
    assert not cluster.router.pool.workers[DEAD].healthy
    assert cluster.router.pool.workers[SURVIVOR].healthy
    # ejected at the first broken stream, one hop after the death
    late = [r for r in records if r.arrival_s > KILL_S + 2 * HOP_S]
    assert late and all(r.decode == SURVIVOR and r.outcome == "finished" for r in late)
    assert all(not r.worker_failures for r in late)


def test_prefill_jobs_writing_into_a_dead_decode_node_end_and_free_their_blocks():
    cluster = Cluster(ClusterConfig(num_prefill=1, num_decode=2), SHAPE, H100, faults=kill_decode())
    jobs_at_death: list[str] = []

    def count_jobs() -> None:
        prefill = cluster.prefills[0]
        dead = cluster.decodes[0]
        jobs_at_death.extend(k for k, j in prefill.jobs.items() if j.msg.decode is dead)

    cluster.events.at(KILL_S, count_jobs)
    records = cluster.run(REQUESTS)
    assert_clean(cluster, records)  # no request, block in use or hold left on live nodes
    assert jobs_at_death
    f = failures(cluster, records)
    assert sum(f["kv_transfer_failures"].values()) >= 1
    assert set(f["kv_transfer_failures"]) <= {"post", "write", "notify"}
    assert f["held_blocks_at_end"] == 0
    prefill = cluster.prefills[0]
    assert not any(key in prefill.jobs for key in jobs_at_death)


def test_a_retry_whose_attempt_the_dead_node_also_sent_is_still_prefilled_remotely():
    """The router retries under the same request id and the survivor numbers its attempts
    from 1, as the dead node did; the prefill worker still holding the dead node's job tells
    them apart by the decode agent (it used to refuse the retry, and the survivor fell back
    to a local prefill)."""
    cluster = Cluster(ClusterConfig(num_prefill=1, num_decode=2), SHAPE, H100, faults=kill_decode())
    prefill, dead = cluster.prefills[0], cluster.decodes[0]
    collided: list[str] = []
    submit = prefill.submit

    def watch(msg):
        if msg.decode is not dead and any(
            job.msg.decode is dead
            and (job.msg.request_id, job.msg.attempt) == (msg.request_id, msg.attempt)
            for job in prefill.jobs.values()
        ):
            collided.append(msg.request_id)
        submit(msg)

    prefill.submit = watch
    records = cluster.run(REQUESTS)
    assert_clean(cluster, records)
    assert collided  # the dead node's attempt was still on the worker when the retry came
    retried = {r.request_id: r for r in hit(records) if r.outcome == "finished"}
    assert set(collided) <= retried.keys()
    for request_id in collided:
        record = retried[request_id]
        assert record.decode == SURVIVOR and record.remote and not record.fallbacks
    assert not failures(cluster, records)["fallbacks"]


def test_a_restarted_decode_worker_rejoins_and_gets_traffic():
    restart_after_s = 1.0
    cluster, records = run(ClusterConfig(num_prefill=1, num_decode=2), kill_decode(restart_after_s))
    f = failures(cluster, records)
    assert f["decode_deaths"] == 1 and f["decode_restarts"] == 1
    old, new = cluster.retired[0], cluster.decodes[0]
    assert old.dead and not new.dead and new.agent != old.agent
    worker = cluster.router.pool.workers[DEAD]
    assert worker.healthy and worker.agent == new.agent
    # back at the first health round after the restart (rounds every second)
    back = [r for r in records if r.arrival_s > 2.0 + HOP_S]
    assert back and any(r.decode == DEAD for r in back)
    assert all(r.outcome == "finished" and not r.worker_failures for r in back)
    assert new.num_steps > 0


def test_with_its_only_decode_worker_dead_requests_fail_until_it_is_back():
    """Panic routing (`WorkerPool.snapshot`) still names the ejected worker; the connection
    is refused and the retry finds no other worker: 503 (`Unavailable`)."""
    cluster, records = run(ClusterConfig(num_prefill=1, num_decode=1), kill_decode(1.0))
    down = [r for r in records if KILL_S + HOP_S < r.arrival_s < KILL_S + 1.0]
    assert down and all(r.outcome == "error" and r.error == "unavailable" for r in down)
    assert all(r.worker_failures == ["decode_failed"] for r in down)
    back = [r for r in records if r.arrival_s > 2.0 + HOP_S]
    assert back and all(r.outcome == "finished" for r in back)
    f = failures(cluster, records)
    assert f["errors_by_kind"]["unavailable"] >= len(down)
    assert f["router_retries"]["decode_failed"] == f["errors_by_kind"]["unavailable"]


def test_a_run_with_a_decode_death_is_deterministic():
    config = ClusterConfig(num_prefill=2, num_decode=3)
    faults = Faults(
        abort_share=0.2,
        abort_after_s=0.3,
        outages=(Outage(1, 0.4, 0.5, role="decode"), Outage(0, 0.8, role="prefill")),
        seed=3,
    )

    def outcome() -> list[tuple]:
        _, records = run(config, faults)
        return [(r.request_id, r.outcome, r.error, r.decode, r.first_token_s) for r in records]

    assert outcome() == outcome()


def test_bad_decode_outages_are_refused():
    assert Outage.parse("1@2.5+3", "decode") == Outage(1, 2.5, 3.0, "decode")
    with pytest.raises(ValueError, match="WORKER@SECONDS"):
        Outage.parse("1@soon", "decode")
    with pytest.raises(ValueError, match="restart delay"):
        Outage.parse("1@2+0", "decode")
    with pytest.raises(ValueError, match="role"):
        Outage(0, 1.0, role="router")
    cluster = Cluster(ClusterConfig(num_decode=2), SHAPE, H100, faults=kill_decode_of(2))
    with pytest.raises(ValueError, match="decode worker 2: there are 2"):
        cluster.run(REQUESTS[:2])


def kill_decode_of(index: int) -> Faults:
    return Faults(outages=(Outage(index, 1.0, role="decode"),))


@pytest.mark.parametrize("router_token_s", [0.0, 3e-4, 2e-3])
def test_a_reset_does_not_overtake_the_tokens_the_router_has_yet_to_relay(router_token_s):
    # On a CPU host the router's event loop relays tokens in its turn; the dead decode
    # node's connection reset reaches it behind the tokens that node made before it died.
    # So a request that streamed from the dead node ends as a broken stream (or finished,
    # if its last token came first) and is never run again on the survivor.
    import dataclasses

    from tandem.sim.workload import synthetic

    profile = dataclasses.replace(H100, host_cores=8, host_router_token_s=router_token_s)
    config = ClusterConfig(num_prefill=1, num_decode=2)
    cluster = Cluster(config, SHAPE, profile, faults=kill_decode())
    dead, made = cluster.decodes[0], {}
    relay = cluster.relay

    def watch(requests):
        for r in requests:
            live = cluster._live.get(r.request_id)
            if live is not None and live.node is dead and live.request is r:
                made[r.request_id] = made.get(r.request_id, False) or r.is_finished
        relay(requests)

    cluster.relay = watch
    reqs = synthetic(200, 100.0, (200, 400), (30, 80), SHAPE.vocab_size, seed=5)
    records = {r.request_id: r for r in cluster.run(reqs)}
    assert made and hit(list(records.values()))
    for rid, finished in made.items():
        record = records[rid]
        assert record.decode == DEAD, rid  # not retried on the survivor
        assert record.outcome == ("finished" if finished else "error"), rid
    assert_clean(cluster, list(records.values()))
