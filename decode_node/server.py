"""The decode node process: the token-level HTTP API for the router, the engine loop, the
DEALER sockets to prefill workers, and the PUB socket with KV events and load.

`POST /generate` streams newline-delimited JSON records: `token_ids`, `text` (the delta),
`logprobs`, and on the last record `finish_reason`, `stop_reason`, `usage` (and `error`
when the request failed). `POST /abort` ends a request wherever it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
from collections.abc import AsyncIterator

import msgspec
import zmq
from fastapi import Request as HttpRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CollectorRegistry

from tandem.decode_node.node import DecodeNode, DecodeOptions, DuplicateRequest, GenerateInput
from tandem.decode_node.prefill_client import PrefillClient
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.http import error_body
from tandem.engine.api.kv_events import KVEventPublisher
from tandem.engine.api.wire import (
    ProtocolMismatch,
    decode_abort,
    decode_generate,
    error_message,
    error_param,
)
from tandem.engine.telemetry import request_log, tracing
from tandem.node.core import NodeCore, NodeIdentity
from tandem.node.flags import configure_process, engine_args_from
from tandem.node.heartbeat import Heartbeat
from tandem.node.loop import NodeLoop
from tandem.node.server import NodeServer

logger = logging.getLogger(__name__)

_REMOTE_POLL_MS = 1  # NIXL notifications have no file descriptor: poll while waiting
_IDLE_POLL_MS = 100


class DecodeLoop:
    """One iteration: wait, run queued calls, send what waited for a connection (and hear
    what never will be), read replies, notifications and dropped connections, step,
    publish KV events."""

    def __init__(
        self,
        core: NodeCore,
        loop: NodeLoop,
        options: DecodeOptions,
        host: str,
        pub_port: int,
        traces: tracing.Tracing | None = None,
        token: DeploymentToken | None = None,
    ) -> None:
        self.core = core
        self.loop = loop
        self.context = zmq.Context()
        self.poller = zmq.Poller()
        self.poller.register(loop.wake_fd, zmq.POLLIN)
        self.client = PrefillClient(
            self.context, self.poller, core.fingerprint, token or DeploymentToken(), core.metrics
        )
        self.publisher = KVEventPublisher(self.context, host, pub_port, core.agent.name)
        self.node = DecodeNode(core, self.client, core.tokenizer, options, traces)

    def run_once(self) -> None:
        node = self.node
        soon = node.waiting_remote or self.core.copies_in_flight
        timeout = 0 if node.busy else _REMOTE_POLL_MS if soon else _IDLE_POLL_MS
        if timeout:
            self.core.steps.wait()
        self.poller.poll(timeout)
        self.loop.run_calls()
        for endpoint, msg in self.client.unsent():
            node.on_unsent(endpoint, msg)
        for endpoint, msg in self.client.receive():
            node.on_reply(endpoint, msg)
        for sender, data in self.core.agent.notifications():
            node.on_notification(sender, data)
        for endpoint in self.client.lost():
            node.on_disconnect(endpoint)
        node.step()
        self.core.agent.expect_writes(node.waiting_remote)
        self.core.metrics.observe(self.core.scheduler)
        events = self.core.kv.pool.events
        self.publisher.publish(events, self.core.load(), self.core.tier_events())
        events.clear()

    def ports(self) -> dict[str, int]:
        return {"events_port": self.publisher.port}

    def debug_report(self) -> dict[str, object]:
        """Holds past their timeout whose writer may still write (part of `held`)."""
        failover = self.node.failover
        return {
            "quarantined": failover.num_quarantined_blocks,
            "quarantined_holds": sorted(failover.quarantined),
        }

    def close(self) -> None:
        self.client.close()
        self.publisher.close()
        self.context.term()
        self.core.close()


def add_decode_routes(server: NodeServer) -> None:
    app = server.app

    @app.post("/generate")
    async def generate(http: HttpRequest) -> Response:
        try:
            body = decode_generate(await http.body())
        except msgspec.DecodeError as exc:
            return _refuse_body(server, exc)
        if (busy := server.not_ready()) is not None:
            return busy
        node: DecodeNode = server.role.node
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[dict] = asyncio.Queue()
        log_id = request_log.clean(http.headers.get(request_log.HEADER))
        inp = GenerateInput(
            body.request_id, body.token_ids, body.sampling, body.prefill,
            body.prefill_alternates, body.cache_salt, log_id, tracing.from_headers(http.headers),
        )  # fmt: skip
        try:
            with request_log.request_context(log_id):
                await server.call(lambda: node.add(inp, _sink(loop, queue)))
        except DuplicateRequest as exc:
            return error_body(str(exc), 409, "conflict_error")
        except ValueError as exc:
            return error_body(str(exc), 400)
        return StreamingResponse(
            _records(server, node, body.request_id, queue), media_type="application/x-ndjson"
        )

    @app.post("/abort")
    async def abort(http: HttpRequest) -> Response:
        try:
            body = decode_abort(await http.body())
        except msgspec.DecodeError as exc:
            return _refuse_body(server, exc)
        if (busy := server.not_ready()) is not None:
            return busy
        node: DecodeNode = server.role.node
        found = await server.call(lambda: node.abort(body.request_id))
        return JSONResponse({"aborted": found})


def _refuse_body(server: NodeServer, exc: msgspec.DecodeError) -> Response:
    """400 naming the field, for a body that is not the wire schema's; counted by reason
    (one of another protocol version apart) once the node's metrics exist."""
    if (m := server.node_metrics()) is not None:
        reason = "protocol" if isinstance(exc, ProtocolMismatch) else "undecodable"
        m.child(m.refused_inputs, reason=reason).inc()
    return error_body(error_message(exc), 400, param=error_param(exc))


def _sink(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    def put(record: dict) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, record)

    return put


async def _records(
    server: NodeServer, node: DecodeNode, request_id: str, queue: asyncio.Queue
) -> AsyncIterator[bytes]:
    """The response body; if the client goes away first, the request is aborted."""
    finished = False
    try:
        while not finished:
            record = await queue.get()
            finished = record["finish_reason"] is not None
            yield (json.dumps(record) + "\n").encode()
    finally:
        if not finished:
            server.loop.call(lambda: node.abort(request_id))


def run(args: argparse.Namespace) -> None:
    """Serve as a decode node."""
    configure_process(args)
    identity = NodeIdentity.of(args, "decode")
    registry = CollectorRegistry()
    traces = tracing.Tracing("tandem-decode", args.otlp_traces_endpoint)
    token = DeploymentToken.from_env()
    options = DecodeOptions(
        args.remote_prefill_threshold,
        args.on_prefill_failure,
        args.prefill_timeout,
        args.hold_timeout,
    )

    def build(loop: NodeLoop) -> DecodeLoop:
        config = engine_args_from(args).create_config()
        core = NodeCore(
            config,
            identity,
            registry,
            args.remote_prefill_threshold,
            record_events=config.cache.enable_prefix_caching,
        )
        decode_loop = DecodeLoop(core, loop, options, args.host, args.zmq_port, traces, token)
        logger.info(
            "decode node: agent %s, KV events on port %d",
            core.agent.name,
            decode_loop.publisher.port,
        )
        return decode_loop

    heartbeat = Heartbeat(args.engine_stall_timeout)
    server = NodeServer(build, registry, heartbeat, args.debug_endpoints, token)
    add_decode_routes(server)
    try:
        server.serve(args.host, args.http_port, args.metrics_port, args.log_level)
    finally:
        traces.shutdown()
