"""Block hashes cover the model revision (design §4): a node labelled with a revision
publishes its blocks under hashes that include it, and the router matches each worker's KV
events with the hashes of that worker's revision, so a rolling update never counts blocks
of the old model as a prefix hit for the new one."""

from __future__ import annotations

from tandem.engine.api.kv_events import KVEventBatch, Load
from tandem.engine.core.block_hash import hash_blocks
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.core.sampling_params import SamplingParams
from tandem.router.dispatch import Dispatcher
from tandem.router.kv_index import PrefixIndex
from tandem.router.preprocess import Prompt
from tandem.router.workers import WorkerAddress, WorkerPool

BLOCK_SIZE = 4
TOKENS = list(range(10, 23))  # 3 full blocks and one token


def node_hashes(revision: str, cache_salt: str | None = None) -> list[int]:
    """What a node of `revision` publishes after computing the prompt."""
    kv = KVCacheManager(block_size=BLOCK_SIZE, num_blocks=8, revision=revision)
    request = Request("r", TOKENS, SamplingParams(), cache_salt=cache_salt)
    assert kv.allocate_slots(request, len(TOKENS)) is not None
    return [b.block_hash for b in kv.pool.blocks if b.block_hash is not None]


def router_prompt(cache_salt: str | None = None) -> Prompt:
    hashes = hash_blocks(TOKENS, BLOCK_SIZE, (cache_salt,) if cache_salt else ())
    return Prompt(TOKENS, None, tuple(hashes), cache_salt)


def test_a_revision_changes_every_block_hash_and_unlabelled_nodes_keep_theirs():
    plain, old, new = node_hashes(""), node_hashes("rev-1"), node_hashes("rev-2")
    assert plain == hash_blocks(TOKENS, BLOCK_SIZE)
    assert len(set(plain) | set(old) | set(new)) == 9  # three disjoint chains of 3
    assert router_prompt().hashes_for("rev-1", BLOCK_SIZE) == tuple(old)
    assert router_prompt().hashes_for("", BLOCK_SIZE) == tuple(plain)


def test_the_router_and_the_node_agree_with_a_cache_salt_too():
    prompt = router_prompt("tenant-a")
    assert prompt.hashes_for("rev-1", BLOCK_SIZE) == tuple(node_hashes("rev-1", "tenant-a"))
    assert prompt.block_hashes == tuple(node_hashes("", "tenant-a"))


def test_each_worker_is_matched_under_its_own_revision():
    pool, index = WorkerPool(), PrefixIndex()
    urls = {"http://old": "rev-1", "http://new": "rev-2", "http://plain": ""}
    pool.update([WorkerAddress(url, "decode") for url in urls])
    for url, revision in urls.items():
        pool.workers[url].info = {"revision": revision}
        index.apply(url, _first_contact(url))
        index.load_snapshot(url, f"agent-{url}", 0, node_hashes("rev-1"))  # all hold rev-1's
    dispatcher = Dispatcher(pool, index, None, None, None, BLOCK_SIZE)
    matches = dispatcher._matches(router_prompt())
    overlaps = {url: match.num_blocks for url, match in matches.items()}
    assert overlaps == {"http://old": 3, "http://new": 0, "http://plain": 0}


def _first_contact(url: str) -> KVEventBatch:
    return KVEventBatch(0, f"agent-{url}", [], [], Load(0, 0, 8, 8))
