"""Routing policies: pure functions `choose(snapshot, request) -> Route`.

A snapshot holds frozen views of the healthy workers, each with its load and the prompt's
leading blocks it has cached, per tier (device, host memory, disk). A policy picks the
decode worker first, then a prefill worker of the same model revision (none when that
revision has no prefill worker: the decode node then prefills locally). Other prefill
workers of that revision, best first, are the decode node's alternates when the chosen one
fails.

- `round-robin`: the request's sequence number picks, in URL order.
- `least-load`: fewest pending requests (ties rotate with the sequence number).
- `prefix-aware`: the longest cached prefix (in any tier), then least load.
- `kv-aware` (default): the lowest cost, counted in blocks of prefill work: the prompt's
  work left on a prefill worker (a block past its cached prefix costs 1, a cached one 0 on
  the device, `TierCosts` in a lower tier, where it is loaded back instead of computed),
  plus one such request per request already pending there; for decode, that work (the
  blocks to receive) plus the blocks its requests hold, and a large penalty when its free
  blocks cannot hold the prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tandem.router.workers import WorkerView

# Added to a decode worker's cost when the prompt does not fit its free blocks now.
_FULL_PENALTY = 1_000_000


@dataclass(frozen=True)
class TierCosts:
    """What a prompt block cached in a lower tier costs `kv-aware`, in blocks of prefill
    work (a device hit costs 0, a miss 1): the node loads it back to the device instead
    of computing it. The defaults are estimates of that ratio (docs/router.md)."""

    host_hit_cost: float = 0.1  # a copy from host memory over PCIe
    disk_hit_cost: float = 0.3  # a read from local storage, then that copy

    def __post_init__(self) -> None:
        for name in ("host_hit_cost", "disk_hit_cost"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], not {value}")


DEFAULT_TIER_COSTS = TierCosts()


@dataclass(frozen=True)
class RouteRequest:
    seq: int  # the router's running request number
    num_blocks: int  # full blocks in the prompt (len(block_hashes))
    num_tokens: int
    block_size: int = 16
    tier_costs: TierCosts = DEFAULT_TIER_COSTS  # this router's (its --kv-*-hit-cost flags)


@dataclass(frozen=True)
class Snapshot:
    prefill: tuple[WorkerView, ...]
    decode: tuple[WorkerView, ...]


@dataclass(frozen=True)
class Route:
    decode: WorkerView
    prefill: WorkerView | None
    alternates: tuple[WorkerView, ...] = ()


Policy = Callable[[Snapshot, RouteRequest], Route | None]
Key = Callable[[WorkerView, int], tuple]


def _ranked(workers: Sequence[WorkerView], req: RouteRequest, key: Key) -> list[WorkerView]:
    """Best first by `key`; ties broken by a rotation that moves with `req.seq`."""
    n = len(workers)
    order = sorted(range(n), key=lambda i: (*key(workers[i], i), (i - req.seq) % n))
    return [workers[i] for i in order]


def _pair(snapshot: Snapshot, req: RouteRequest, decode_key: Key, prefill_key: Key) -> Route | None:
    if not snapshot.decode:
        return None
    decode = _ranked(snapshot.decode, req, decode_key)[0]
    same = [p for p in snapshot.prefill if p.revision == decode.revision]
    if not same:
        return Route(decode, None)
    ranked = _ranked(same, req, prefill_key)
    return Route(decode, ranked[0], tuple(ranked[1:]))


def round_robin(snapshot: Snapshot, req: RouteRequest) -> Route | None:
    def key(_w: WorkerView, _i: int) -> tuple:
        return ()

    return _pair(snapshot, req, key, key)


def least_load(snapshot: Snapshot, req: RouteRequest) -> Route | None:
    def key(w: WorkerView, _i: int) -> tuple:
        return (w.pending,)

    return _pair(snapshot, req, key, key)


def prefix_aware(snapshot: Snapshot, req: RouteRequest) -> Route | None:
    def key(w: WorkerView, _i: int) -> tuple:
        return (-w.overlap_blocks, w.pending)

    return _pair(snapshot, req, key, key)


def kv_aware(snapshot: Snapshot, req: RouteRequest) -> Route | None:
    return _pair(
        snapshot,
        req,
        lambda w, _i: (decode_cost(w, req),),
        lambda w, _i: (prefill_cost(w, req),),
    )


def prefill_cost(worker: WorkerView, req: RouteRequest) -> float:
    """Blocks of prompt work: this prompt's work left there, plus a whole prompt's per
    pending request."""
    return prompt_work(worker, req) + worker.pending * max(req.num_blocks, 1)


def prompt_work(worker: WorkerView, req: RouteRequest) -> float:
    """The prompt's blocks of prefill work left on the worker: 1 per block past its cached
    prefix, 0 per device hit, a fraction per hit in a lower tier (`req.tier_costs`)."""
    costs = req.tier_costs
    misses = req.num_blocks - worker.overlap_blocks
    loads = worker.host_blocks * costs.host_hit_cost + worker.disk_blocks * costs.disk_hit_cost
    return misses + loads


def decode_cost(worker: WorkerView, req: RouteRequest) -> float:
    """Blocks to receive (or to load from its own lower tiers) plus the blocks its requests
    hold (both in blocks, as Dynamo's KV router weighs new prefill blocks against active
    decode blocks); a full worker only as a last resort. Counting its load in requests
    let a long cached prefix outweigh hundreds of queued requests (the simulator's
    64-worker runs, docs/performance.md)."""
    needed = req.num_tokens // req.block_size + 1  # the prompt plus the first decode step
    full = worker.total_blocks > 0 and worker.free_blocks < needed
    penalty = _FULL_PENALTY if full else 0
    return prompt_work(worker, req) + active_blocks(worker, req) + penalty


def active_blocks(worker: WorkerView, req: RouteRequest) -> int:
    """The blocks its requests hold: the node's count (blocks not free), or, while that
    lags by an event batch, the router's requests there at this prompt's size."""
    held = max(worker.total_blocks - worker.free_blocks, 0)
    return max(held, worker.inflight * max(req.num_blocks, 1))


POLICIES: dict[str, Policy] = {
    "round-robin": round_robin,
    "least-load": least_load,
    "prefix-aware": prefix_aware,
    "kv-aware": kv_aware,
}
