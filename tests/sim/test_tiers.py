"""KV tiers in the simulator: the real `KVTiers` under each node's pool, its copies on a
simulated link, its events in the router's index; multi-turn conversations on a device pool
smaller than their working set."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from tandem.engine.core.tier_ops import DEVICE, DISK, HOST, TierCopy
from tandem.operator.spec import parse
from tandem.sim.cluster import Cluster, ClusterConfig
from tandem.sim.events import EventQueue
from tandem.sim.plan import Candidate, deployment_yaml
from tandem.sim.profiles import PROFILE_DIR, DeviceProfile, load_profile
from tandem.sim.results import SLO, summarize
from tandem.sim.shapes import SHAPES
from tandem.sim.tier_link import SimTierTransport, copy_seconds
from tandem.sim.workload import SimRequest
from tests.sim.test_cli import tandem

SHAPE = SHAPES["llama-3-8b"]
H100 = load_profile("h100")
BLOCK_BYTES = SHAPE.kv_block_bytes(H100.dtype_bytes, 16)  # 2 MiB
# One decode node (it prefills too) whose 64 blocks hold under two conversations' prompts.
SMALL = ClusterConfig(num_prefill=0, num_decode=1, num_kv_blocks=64, max_model_len=2048)


def conversations(num: int, turns: int, gap_s: float = 0.1) -> list[SimRequest]:
    """`num` chats of `turns` turns: a turn's prompt is the previous one plus 128 new tokens
    (256 to begin with); the chats take turns, one request every `gap_s`, so between two
    turns of a chat the others have used the device pool."""
    rng = np.random.default_rng(0)
    texts = [rng.integers(0, SHAPE.vocab_size, 256 + 128 * turns).tolist() for _ in range(num)]
    out = []
    for t in range(turns):
        for c in range(num):
            prompt = texts[c][: 256 + 128 * t]
            out.append(SimRequest.of_tokens(f"c{c}t{t}", len(out) * gap_s, prompt, 4))
    return out


def run(config: ClusterConfig, requests: list[SimRequest], profile: DeviceProfile = H100):
    cluster = Cluster(config, SHAPE, profile)
    records = cluster.run(requests)
    cluster.check_integrity()
    for node in cluster.nodes.values():  # every block accounted for, nothing held
        assert not node.scheduler.requests and not node.kv.hold_keys()
        assert node.kv.pool.num_free_blocks == node.kv.num_blocks
        if node.kv.tiers is not None:
            assert not node.kv.tiers.in_flight and not node.kv.tiers.held_blocks()
    assert all(r.outcome == "finished" for r in records)
    return cluster, records, summarize(cluster, records, SLO())


def ttft_p50(records) -> float:
    return float(np.median([r.first_token_s - r.arrival_s for r in records]))


def test_a_host_tier_turns_evicted_turns_into_hits_and_shortens_the_first_token():
    requests = conversations(8, 4)
    _, none, plain = run(SMALL, requests)
    cluster, host, tiered = run(dataclasses.replace(SMALL, kv_host_blocks=2048), requests)
    hits = tiered["prefix_cache"]["tier_hits"]
    assert plain["prefix_cache"]["tier_hits"]["host"] == 0
    # every later turn finds its previous turn's whole blocks in host memory
    later = sum((256 + 128 * (t - 1)) // 16 * 16 for t in range(1, 4)) * 8
    assert hits["host"] >= later - hits["device"]
    assert tiered["prefix_cache"]["hit_rate"] > plain["prefix_cache"]["hit_rate"] + 0.3
    assert ttft_p50(host) < ttft_p50(none)
    moved = tiered["kv_tiers"]["moved"]
    assert moved["host"]["up"] == hits["host"] // 16
    assert moved["host"]["down"] == len(cluster.decodes[0].kv.tiers.host)  # nothing demoted
    assert moved["disk"] == {"down": 0, "up": 0} and hits["disk"] == 0
    assert tiered["kv_tiers"]["copies"] > 0 and tiered["kv_tiers"]["copy_busy_s"] > 0


def test_a_slower_host_link_makes_the_loads_and_the_first_token_slower():
    requests = conversations(8, 4)
    config = dataclasses.replace(SMALL, kv_host_blocks=2048)
    slow = dataclasses.replace(
        H100,
        host_link_bandwidth=H100.host_link_bandwidth / 100,
        host_link_latency_s=H100.host_link_latency_s * 100,
    )
    _, fast_records, fast = run(config, requests)
    _, slow_records, slowed = run(config, requests, slow)
    assert slowed["kv_tiers"]["copy_busy_s"] > 50 * fast["kv_tiers"]["copy_busy_s"]
    assert ttft_p50(slow_records) > ttft_p50(fast_records) + 0.05
    assert slowed["prefix_cache"]["tier_hits"]["host"] > 0  # it still loads, only later


def test_a_disk_tier_under_a_small_host_tier_finds_what_the_host_demoted():
    requests = conversations(8, 4)
    config = dataclasses.replace(SMALL, kv_host_blocks=32, kv_disk_blocks=4096)
    cluster, _, summary = run(config, requests)
    hits, moved = summary["prefix_cache"]["tier_hits"], summary["kv_tiers"]["moved"]
    assert hits["disk"] > 0 and moved["disk"]["up"] == hits["disk"] // 16
    assert moved["disk"]["down"] > 0
    tiers = cluster.decodes[0].kv.tiers
    assert len(tiers.host) == 32 and len(tiers.disk) == moved["disk"]["down"]
    _, _, host_only = run(dataclasses.replace(config, kv_disk_blocks=0), requests)
    assert summary["prefix_cache"]["hit_rate"] > host_only["prefix_cache"]["hit_rate"]


def test_the_router_index_holds_every_tier_of_every_node_and_keeps_chats_on_their_node():
    config = dataclasses.replace(SMALL, num_decode=2, kv_host_blocks=2048, kv_disk_blocks=0)
    cluster, records, summary = run(config, conversations(8, 4))
    index = cluster.router.index
    for url, node in cluster.nodes.items():
        known = index.nodes[url]
        assert known.device == set(node.kv.pool.cached)
        assert known.host == set(node.kv.tiers.host.hashes()) and known.host
    # kv-aware counts a host hit at 0.1 of a computed block: a chat's turns stay where its
    # earlier turns are, though the device pools have long evicted them
    where: dict[str, set[str]] = {}
    for r in records:
        where.setdefault(r.request_id.split("t")[0], set()).add(r.decode)
    assert all(len(nodes) == 1 for nodes in where.values())
    assert len({r.decode for r in records}) == 2
    assert summary["prefix_cache"]["tier_hits"]["host"] > 0


def test_a_disaggregated_deployment_loads_on_both_sides_and_accounts_every_block():
    config = ClusterConfig(
        num_prefill=1, num_decode=1, num_kv_blocks=64, max_model_len=2048, kv_host_blocks=2048
    )
    cluster, records, summary = run(config, conversations(6, 3))
    assert all(r.remote for r in records)
    for node in cluster.nodes.values():
        assert node.kv.stats.tier_hits["host"] > 0, node.role
    assert summary["kv_tiers"]["moved"]["host"]["up"] > 0


def copy(copy_id: int, src: str, dst: str, num_blocks: int) -> TierCopy:
    slots = tuple(range(num_blocks))
    return TierCopy(copy_id, src, dst, slots, slots)


def fake_node(profile: DeviceProfile) -> SimpleNamespace:
    events = EventQueue()
    node = SimpleNamespace(cluster=SimpleNamespace(profile=profile, events=events), dead=False)
    node.pokes = []
    node.poke = lambda: node.pokes.append(events.now)
    return node


def test_the_link_runs_copies_one_at_a_time_in_order_at_each_directions_rate():
    profile = dataclasses.replace(
        H100, host_link_bandwidth=1e9, host_link_latency_s=1e-3, disk_bandwidth=1e8,
        disk_latency_s=1e-2,
    )  # fmt: skip
    node = fake_node(profile)
    link = SimTierTransport(node, block_bytes=1_000_000)
    assert copy_seconds(profile, copy(0, DEVICE, HOST, 4), 1_000_000) == pytest.approx(5e-3)
    assert copy_seconds(profile, copy(0, HOST, DISK, 4), 1_000_000) == pytest.approx(5e-2)
    assert copy_seconds(profile, copy(0, DISK, DEVICE, 1), 1_000_000) == pytest.approx(2e-2)
    for c in (copy(0, DEVICE, HOST, 4), copy(1, HOST, DISK, 4), copy(2, HOST, DEVICE, 1)):
        link.submit(c)
    events = node.cluster.events
    events.run(until=0.004)
    assert link.poll() == []
    events.run(until=0.0051)
    assert link.poll() == [(0, True)] and link.poll() == []
    events.run()
    assert link.poll() == [(1, True), (2, True)]
    assert node.pokes == pytest.approx([5e-3, 5.5e-2, 5.7e-2])
    assert link.busy_s == pytest.approx(5.7e-2) and link.num_copies == 3


def test_a_dead_nodes_copies_never_finish():
    node = fake_node(H100)
    link = SimTierTransport(node, BLOCK_BYTES)
    link.submit(copy(0, DEVICE, HOST, 8))
    link.submit(copy(1, DEVICE, HOST, 8))
    node.dead = True
    node.cluster.events.run()
    assert link.poll() == [] and node.pokes == [] and link.num_copies == 0


def test_the_config_refuses_tiers_the_engine_refuses():
    with pytest.raises(ValueError, match="under a host tier"):
        ClusterConfig(kv_disk_blocks=8)
    with pytest.raises(ValueError, match="tensor parallel size 1"):
        ClusterConfig(kv_host_blocks=8, tp_decode=2)
    with pytest.raises(ValueError, match=">= 0"):
        ClusterConfig(kv_host_blocks=-1)
    ClusterConfig(num_prefill=0, tp_prefill=2, kv_host_blocks=8)  # no prefill pool: no TP


def test_the_shipped_profiles_give_their_tier_links_and_bad_ones_are_refused():
    for name in ("h100", "h200", "cpu"):
        profile = load_profile(name)
        given = set(json.loads((PROFILE_DIR / f"{name}.json").read_text()))
        tiers = {"host_link_bandwidth", "host_link_latency_s", "disk_bandwidth", "disk_latency_s"}
        assert tiers <= given, name  # measured or cited, not the defaults
        if name != "cpu":  # the cpu's disk tier is in the page cache
            assert profile.disk_bandwidth < profile.host_link_bandwidth
    with pytest.raises(ValueError, match="disk_bandwidth must be positive"):
        dataclasses.replace(H100, disk_bandwidth=0)
    with pytest.raises(ValueError, match="disk_latency_s must not be negative"):
        dataclasses.replace(H100, disk_latency_s=-1e-3)


def test_simulate_takes_the_tier_flags_in_gib_and_reports_the_tiers(tmp_path):
    out = tmp_path / "r.json"
    result = tandem(
        "simulate", "--num-requests", "40", "--rate", "20", "--prompt-tokens", "64,512",
        "--output-tokens", "4,8", "--prefill", "0", "--decode", "1", "--shared-prefix", "256",
        "--num-kv-blocks", "64", "--kv-host-gib", "1", "--kv-disk-gib", "2.5",
        "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    # llama-3-8b in bf16: 2 MiB a block of 16 tokens
    assert (data["cluster"]["kv_host_blocks"], data["cluster"]["kv_disk_blocks"]) == (512, 1280)
    run = data["runs"][0]
    assert run["kv_tiers"]["host_blocks"] == 512 and "KV tiers (512 host" in result.stdout
    assert sum(run["prefix_cache"]["tier_hits"].values()) > 0
    result = tandem("simulate", "--num-requests", "2", "--kv-disk-gib", "1")
    assert result.returncode != 0 and "under a host tier" in result.stderr
    result = tandem("simulate", "--num-requests", "2", "--kv-host-gib", "0.001")
    assert result.returncode != 0 and "holds no block" in result.stderr


def test_plan_with_tiers_searches_tp1_and_gives_both_pools_the_tiers(tmp_path):
    out = tmp_path / "plan.yaml"
    result = tandem(
        "plan", "--target-rate", "5", "--num-requests", "10", "--prompt-tokens", "64,256",
        "--output-tokens", "4,8", "--tp", "1,2", "--thresholds", "0", "--max-devices", "2",
        "--slo-ttft", "5", "--slo-tpot", "1", "--max-model-len", "2048",
        "--kv-host-gib", "8", "--kv-disk-gib", "100", "--yaml", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "searching TP 1 only" in result.stdout and "TP2" not in result.stdout
    spec = parse(yaml.safe_load(out.read_text()))  # the operator takes it
    for pool in (spec.prefill, spec.decode):
        assert pool.kv_tiers.host_bytes == 8 * 2**30
        assert pool.kv_tiers.disk.num_bytes == 100 * 2**30


def test_an_llmdeployment_without_tiers_has_none():
    text = deployment_yaml(Candidate(ClusterConfig(), {}), "llama-3-8b", "kv-aware")
    spec = yaml.safe_load(text)["spec"]
    assert "kvTiers" not in spec["prefill"] and "kvTiers" not in spec["decode"]
    half = deployment_yaml(Candidate(ClusterConfig(), {}), "m", "kv-aware", (0.5, 0.0))
    assert yaml.safe_load(half)["spec"]["decode"]["kvTiers"] == {"host": {"size": "0.5Gi"}}
