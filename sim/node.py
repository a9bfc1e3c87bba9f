"""One simulated node: the real `Scheduler`, `KVCacheManager` and `BlockPool`, stepped in
simulated time. The model is the only stand-in: a step takes the step-time model's time
(times a factor drawn for it where the profile gives the role's steps a spread) and samples
a fixed token for every request whose computed tokens reach its end.

The loop mirrors a node's engine thread (`decode_node/server.py`, `prefill_node/server.py`):
schedule, run the step, update from its output, publish KV events and load. Messages
(`deliver`) are handled between steps, as the loop reads its sockets between steps: one that
arrives during a step waits for its end (or for the end of a wait before a step, which a
role may add: `wait_before_step`). Subclasses add what the role does around the step in
the engine step's hooks (`StepHooks`, engine/step.py), at the points the real nodes do.

With lower KV tiers (`ClusterConfig.kv_host_blocks`), the real `KVTiers` sits under the pool
as on a real node, its copies on a simulated link (`sim/tier_link.py`) that wakes the node
when one finishes; its events go out with the pool's.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tandem.engine.api.kv_events import (
    NO_TIER_EVENTS,
    KVEventBatch,
    KVSnapshot,
    Load,
    TierEvents,
    load_of,
)
from tandem.engine.core.config import SchedulerConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.request import Request
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from tandem.engine.step import StepHooks
from tandem.engine.telemetry.step_log import context_lens
from tandem.sim.step_model import StepShape, StepTimeModel
from tandem.sim.tier_link import SimTierTransport

if TYPE_CHECKING:
    from tandem.sim.cluster import Cluster

# The token every simulated step samples; requests ignore EOS and stop on length.
SAMPLED_TOKEN = 1


class SimNode(StepHooks):
    """Owns its scheduler and KV-cache manager; publishes to the cluster's router."""

    def __init__(
        self,
        cluster: Cluster,
        url: str,
        role: str,
        scheduler_config: SchedulerConfig,
        block_size: int,
        num_blocks: int,
        step_model: StepTimeModel,
        remote_prefill_threshold: int = 0,
    ) -> None:
        self.cluster = cluster
        self.url = url
        self.role = role
        self.agent = f"{role}-{url}"
        self.kv = KVCacheManager(block_size, num_blocks, record_events=True)
        self.scheduler = Scheduler(scheduler_config, self.kv, remote_prefill_threshold)
        self.step_model = step_model
        self.stepping = False
        self._poked = False
        self.seq = 0  # of the last KV event batch published
        self._last_load: Load | None = None
        self.busy_s = 0.0
        self.last_step_s = 0.0  # the duration of the last step
        self.kv_usage_s = 0.0  # KV usage at each step's start, times the step's duration
        # requests waiting (`Load.waiting`, the `tandem_num_requests_waiting` gauge) once
        # each step is scheduled, times the step's duration
        self.waiting_s = 0.0
        self.batch_sizes: Counter[int] = Counter()  # steps by the requests in them
        self.num_tokens = 0  # computed by its steps
        self.dead = False  # a killed node ignores its pending events and messages
        self.died_s: float | None = None
        self._inbox: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self.tier_link = self._attach_tiers(block_size, step_model.tp)

    def _attach_tiers(self, block_size: int, tp: int) -> SimTierTransport | None:
        """The deployment's lower KV tiers under this node's pool (None: it has none), their
        copies on a simulated link, as `attach_tiers` puts them under a real node's."""
        config, profile = self.cluster.config, self.cluster.profile
        if not config.kv_host_blocks:
            return None
        block_bytes = self.step_model.shape.kv_block_bytes(profile.dtype_bytes, block_size, tp)
        link = SimTierTransport(self, block_bytes)
        self.kv.attach_tiers(link, config.kv_host_blocks, config.kv_disk_blocks, block_bytes)
        return link

    @property
    def num_steps(self) -> int:
        return sum(self.batch_sizes.values())

    def deliver(self, handler: Callable[..., None], *args: Any) -> None:
        """A message arrived: `handler(*args)` now, or after the step in progress."""
        if self.dead:
            return
        if self.stepping:
            self._inbox.append((handler, args))
        else:
            handler(*args)

    def add(self, request: Request) -> None:
        self.scheduler.add_request(request)
        self.poke()

    def poke(self) -> None:
        """Something changed: step now unless a step runs (it schedules again when done)."""
        if not self.stepping and not self._poked:
            self._poked = True
            self.cluster.events.after(0.0, self._step)

    def _step(self) -> None:
        self._poked = False
        if self.stepping or self.dead:
            return
        self.before_schedule()
        if self.wait_before_step():
            return
        self._run_step()

    def _run_step(self) -> None:
        out = self.scheduler.schedule()
        self.before_run(out)
        if out.is_empty:
            self.publish()
            return
        self.stepping = True
        self.batch_sizes[len(out.scheduled)] += 1
        self.num_tokens += out.total_num_scheduled_tokens
        profile = self.cluster.profile
        factor = self.cluster.spread.factor(*profile.step_spread(self.role))
        work = self.step_model.step_time(step_shape(out), factor)
        now = self.cluster.events.now
        cores = self.cluster.cores
        run_s = profile.host_run_s(self.role)
        args = (out, now, self.kv.usage(), load_of(self.scheduler).waiting)
        cores.start(self, work, self._end_step, *args, role=self.role, process=self, slice_s=run_s)
        # its duration: the work alone, stretched while other steps share the host's cores

    def _end_step(
        self, out: SchedulerOutput, started_s: float, kv_usage: float, num_waiting: int
    ) -> None:
        if self.dead:
            return  # the cluster stopped counting its step when it died
        duration = self.last_step_s = self.cluster.events.now - started_s
        self.busy_s += duration
        self.kv_usage_s += duration * kv_usage
        self.waiting_s += duration * num_waiting
        sampled = [
            SAMPLED_TOKEN if c >= r.num_tokens else None
            for r, c in zip(out.scheduled, context_lens(out))
        ]
        result = ModelRunnerOutput(sampled, [None] * len(sampled))
        self.before_update(out, result)
        finished = self.scheduler.update_from_output(out, result)
        self.after_update(out, result, finished)
        self._read_inbox()
        self.publish()
        self._step()

    def resume(self) -> None:
        """The wait `wait_before_step` began is over: run the step it held back; what
        arrived meanwhile is read after it, as the loop reads its sockets after the step."""
        if self.dead:
            return
        self.stepping = False
        self._run_step()
        if not self.stepping:  # nothing to run
            self._read_inbox()

    def _read_inbox(self) -> None:
        self.stepping = False
        inbox, self._inbox = self._inbox, []
        for handler, args in inbox:
            handler(*args)

    def publish(self) -> None:
        """KV events of every tier and load to the router, when anything changed (one
        network hop, then the router's loop in its turn)."""
        events = self.kv.pool.events
        tiers = self._tier_events()
        load = load_of(self.scheduler)
        if not events and tiers.empty and load == self._last_load:
            return
        self.seq += 1
        batch = KVEventBatch(
            self.seq,
            self.agent,
            [h for stored, h in events if stored],
            [h for stored, h in events if not stored],
            load,
            tiers.host_stored,
            tiers.host_removed,
            tiers.disk_stored,
            tiers.disk_removed,
        )
        events.clear()
        self._last_load = load
        self.cluster.to_router_loop(self.cluster.router.on_kv_events, self.url, batch)

    def _tier_events(self) -> TierEvents:
        """The lower tiers' changes since the last publish (`NodeCore.tier_events`)."""
        if self.kv.tiers is None:
            return NO_TIER_EVENTS
        return TierEvents(**dataclasses.asdict(self.kv.tiers.drain_events()))

    def snapshot(self) -> KVSnapshot:
        """What `GET /kv/snapshot` answers: every tier's hashes as of the last batch."""
        tiers = self.kv.tiers
        lower = {f"{t.name}_hashes": t.hashes() for t in tiers.tiers} if tiers else {}
        return KVSnapshot(self.agent, self.seq, list(self.kv.pool.cached), **lower)

    # -- what each role adds ------------------------------------------------------------

    def before_schedule(self) -> None:
        """At the start of a step, before the scheduler plans it."""

    def wait_before_step(self) -> bool:
        """Whether the loop waits before it schedules the step (messages then wait too, as
        during a step); a role that says so calls `resume` when the wait is over."""
        return False

    # and the engine step's hooks (`StepHooks`: before_run, before_update, after_update),
    # called at the same points of the step as on the real nodes


def step_shape(out: SchedulerOutput) -> StepShape:
    """What the step-time model needs of a step's plan (before its counters advance)."""
    contexts = context_lens(out)
    num_sampled = sum(1 for r, c in zip(out.scheduled, contexts) if c >= r.num_tokens)
    return StepShape.of(out.num_scheduled_tokens, contexts, num_sampled)
