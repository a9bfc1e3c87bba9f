"""What a prefill or decode node's engine thread owns: the model, the KV cache and its
manager, the scheduler, the NIXL agent, the tokenizer and compiled grammars, and the
metrics. The flags every node takes are in `node/flags.py`, the debug views in
`node/debug_routes.py`."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import socket
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from tandem.engine.api.kv_events import NO_TIER_EVENTS, Load, TierEvents, load_of
from tandem.engine.api.wire import PROTOCOL_VERSION, Fingerprint
from tandem.engine.core.config import EngineConfig
from tandem.engine.core.kv_cache_manager import KVCacheManager
from tandem.engine.core.scheduler import ModelRunnerOutput, Scheduler, SchedulerOutput
from tandem.engine.llm_engine import grammar_compiler
from tandem.engine.model_runner import ModelRunner, attach_tiers
from tandem.engine.parallel.rank_processes import exit_process
from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.engine.telemetry.step_log import StepLog, StepWork, context_lens
from tandem.engine.tokenizer import load_tokenizer
from tandem.node.kv_agent import NodeAgent


@dataclass(frozen=True)
class NodeIdentity:
    """Labels and names: `model` and `role` label metrics; `pod` is the host (the pod name
    in Kubernetes); `revision` is what routers pair prefill and decode nodes by."""

    model: str
    role: str
    pod: str
    revision: str = ""

    @classmethod
    def of(cls, args: argparse.Namespace, role: str) -> NodeIdentity:
        model = args.served_model_name or os.path.basename(os.path.normpath(args.model))
        pod = os.environ.get("POD_NAME") or f"{socket.gethostname()}:{args.http_port}"
        return cls(model, role, pod, args.revision)


class NodeCore:
    """Builds the engine parts; lives on the engine thread."""

    def __init__(
        self,
        config: EngineConfig,
        identity: NodeIdentity,
        registry: CollectorRegistry,
        remote_prefill_threshold: int = 0,
        record_events: bool = False,
    ) -> None:
        self.config = config
        self.identity = identity
        self.kv = KVCacheManager(
            config.cache.block_size,
            config.cache.num_blocks,
            config.cache.enable_prefix_caching,
            revision=identity.revision,
            record_events=record_events,
        )
        self.scheduler = Scheduler(config.scheduler, self.kv, remote_prefill_threshold)
        self.runner = ModelRunner(config)
        attach_tiers(self.kv, self.runner, config)
        if self.runner.workers is not None:
            self.runner.workers.watch(exit_process)  # a rank gone: the node is gone
        prefix = f"{identity.role}-{identity.pod}".replace(":", "-")
        self.agent = NodeAgent.create(prefix, self.runner)
        self.tokenizer = load_tokenizer(config.model_dir)
        # Structured outputs arrive as plain data; each node compiles (and caches) its own.
        self.grammars = grammar_compiler(config, self.tokenizer)
        self.grammars.prepare()
        self.metrics = NodeMetrics(registry, identity.model, identity.role, identity.pod)
        self.steps = StepLog()

    def execute(self, out: SchedulerOutput) -> ModelRunnerOutput:
        """Run one scheduled step on the model (which receives only `out.plan`), logged and
        counted."""
        work = StepWork.of(out.num_scheduled_tokens, context_lens(out))
        clocks = self.steps.begin()
        result = self.runner.execute(out.plan)
        sampled = sum(1 for t in result.sampled_token_ids if t is not None)
        self.steps.end(clocks, work, sampled)
        self.metrics.observe_step(out)
        return result

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (their watcher first, so that a rank
        stopping is not taken for one dying)."""
        self.runner.close()

    def load(self) -> Load:
        return load_of(self.scheduler)

    def tier_events(self) -> TierEvents:
        """The lower KV tiers' changes since the last call, for the KV event publisher."""
        if self.kv.tiers is None:
            return NO_TIER_EVENTS
        changes = self.kv.tiers.drain_events()
        if changes.empty:
            return NO_TIER_EVENTS
        return TierEvents(**dataclasses.asdict(changes))

    def tier_hashes(self) -> dict[str, list[int]]:
        """Every hash each lower tier holds, for `/kv/snapshot` (none without tiers)."""
        tiers = self.kv.tiers
        if tiers is None:
            return {}
        return {f"{tier.name}_hashes": tier.hashes() for tier in tiers.tiers}

    @property
    def copies_in_flight(self) -> bool:
        """KV tier copies queued or running: the loop must come back soon to apply them."""
        return self.kv.tiers is not None and self.kv.tiers.in_flight

    @functools.cached_property
    def fingerprint(self) -> Fingerprint:
        """What a peer exchanging KV blocks with this node must share with it (fixed for
        the node's life: /health reports it at every check)."""
        model = self.config.model
        return Fingerprint(
            PROTOCOL_VERSION,
            self.identity.model,
            self.identity.revision,
            str(self.config.dtype).removeprefix("torch."),
            self.config.cache.block_size,
            f"{model.num_layers}x2x{model.num_kv_heads}x{model.head_dim}",
        )
