"""The prefill node process: a ZMQ ROUTER for prefill requests and aborts, the engine loop,
and the HTTP apps (`/health` for the router; `/metrics` and the probes on the metrics port)."""

from __future__ import annotations

import argparse
import logging

import msgspec
import zmq
from prometheus_client import CollectorRegistry

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.kv_events import KVEventPublisher
from tandem.engine.api.wire import Hello
from tandem.engine.telemetry.tracing import Tracing
from tandem.engine.transfer.messages import AbortPrefill, PrefillFailed, decode_to_prefill, encode
from tandem.node.core import NodeCore, NodeIdentity
from tandem.node.flags import configure_process, engine_args_from
from tandem.node.heartbeat import Heartbeat
from tandem.node.loop import NodeLoop
from tandem.node.server import NodeServer
from tandem.prefill_node.node import PrefillNode
from tandem.prefill_node.pairings import Pairings

logger = logging.getLogger(__name__)

# Poll timeouts (ms): while writes are in flight, and when there is nothing to do.
_TRANSFER_POLL_MS = 1
_IDLE_POLL_MS = 100


class PrefillLoop:
    """One iteration: wait for input, run queued calls, read messages, step, poll writes,
    publish KV events (routers steer shared prefixes to the worker that has them). Work is
    taken only from decode-node connections that paired (`Pairings`)."""

    def __init__(
        self,
        core: NodeCore,
        loop: NodeLoop,
        host: str,
        zmq_port: int,
        events_port: int,
        traces: Tracing | None = None,
        token: DeploymentToken | None = None,
    ) -> None:
        self.core = core
        self.loop = loop
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(f"tcp://{host}:{zmq_port}")
        self.zmq_port = zmq_port
        self.publisher = KVEventPublisher(self.context, host, events_port, core.agent.name)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(loop.wake_fd, zmq.POLLIN)
        self.node = PrefillNode(core, self._reply, traces)
        self.pairings = Pairings(
            core.fingerprint, token or DeploymentToken(), core.metrics, core.agent.name
        )

    def run_once(self) -> None:
        node = self.node
        soon = node.jobs or self.core.copies_in_flight
        timeout = 0 if node.busy else _TRANSFER_POLL_MS if soon else _IDLE_POLL_MS
        if timeout:
            self.core.steps.wait()
        self.poller.poll(timeout)
        self.loop.run_calls()
        self._read_messages()
        node.step()
        node.poll()
        self.core.metrics.observe(self.core.scheduler)
        events = self.core.kv.pool.events
        self.publisher.publish(events, self.core.load(), self.core.tier_events())
        events.clear()

    def _read_messages(self) -> None:
        while True:
            try:
                peer, *frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                if len(frames) != 1:  # ours are [identity, payload]
                    raise msgspec.DecodeError(f"{len(frames)} frames, expected 1")
                msg = decode_to_prefill(frames[0])
            except msgspec.DecodeError as exc:
                logger.warning("undecodable message from %r: %s", peer, exc)
                m = self.core.metrics
                m.child(m.refused_inputs, reason="undecodable").inc()
                continue
            if isinstance(msg, Hello):
                self._reply(peer, self.pairings.greet(peer, msg))
            elif not self.pairings.admits(peer):
                self._refuse_unpaired(peer, msg)
            elif isinstance(msg, AbortPrefill):
                self.node.abort(peer, msg)
            else:
                self.node.submit(peer, msg)

    def _refuse_unpaired(self, peer: bytes, msg: object) -> None:
        """A request from a connection that never paired fails (its sender may be a decode
        node whose connection was re-made: it greets again); an abort is dropped (only the
        request's own decode node may end it)."""
        m = self.core.metrics
        m.child(m.refused_inputs, reason="unpaired").inc()
        if not isinstance(msg, AbortPrefill):
            logger.warning("request %s from an unpaired connection %r", msg.request_id, peer)
            self._reply(peer, PrefillFailed(msg.request_id, msg.attempt, "unpaired"))

    def _reply(self, peer: bytes, msg: msgspec.Struct) -> None:
        try:
            self.socket.send_multipart([peer, encode(msg)], zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            logger.warning("could not answer %r: %s", peer, exc)

    def ports(self) -> dict[str, int]:
        return {"zmq_port": self.zmq_port, "events_port": self.publisher.port}

    def debug_report(self) -> dict[str, object]:
        return {"jobs": self.node.report()}

    def close(self) -> None:
        self.socket.close(0)
        self.publisher.close()
        self.context.term()
        self.core.close()


def run(args: argparse.Namespace) -> None:
    """Serve as a prefill node."""
    configure_process(args)
    identity = NodeIdentity.of(args, "prefill")
    registry = CollectorRegistry()
    traces = Tracing("tandem-prefill", args.otlp_traces_endpoint)
    token = DeploymentToken.from_env()

    def build(loop: NodeLoop) -> PrefillLoop:
        config = engine_args_from(args).create_config()
        core = NodeCore(
            config, identity, registry, record_events=config.cache.enable_prefix_caching
        )
        prefill_loop = PrefillLoop(
            core, loop, args.host, args.zmq_port, args.events_port, traces, token
        )
        logger.info("prefill node: agent %s, ZMQ %s", core.agent.name, prefill_loop.ports())
        return prefill_loop

    try:
        NodeServer(
            build, registry, Heartbeat(args.engine_stall_timeout), args.debug_endpoints, token
        ).serve(args.host, args.http_port, args.metrics_port, args.log_level)
    finally:
        traces.shutdown()
