"""Runs a node: the engine thread (it loads the model, then loops) beside two FastAPI apps.
The control app, on the HTTP port, has the routes every node has: `/health` (ready: the
model is loaded and the engine loop turns; the router reads the node's ports from it),
`/kv/snapshot`, and the debug views when turned on (`node/debug_routes.py`). The metrics
app, on the metrics port and a thread of its own, has `/metrics`, `/health` and
`/health/live` (alive: loading, or the loop turns): the port that kubelet probes and
Prometheus scrapes, and the only one the NetworkPolicy opens to the scrapers
(docs/security.md "Ports"). Every route of the control app but `/health` answers only
holders of the deployment's token (401 otherwise)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import msgspec
import uvicorn
from fastapi import Depends, FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import HTTPException
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.http import (
    KEEP_ALIVE_S,
    add_http_error_handler,
    add_validation_handler,
    error_body,
)
from tandem.engine.api.kv_events import KVEventPublisher, KVSnapshot
from tandem.node.core import NodeCore
from tandem.node.debug_routes import add_debug_routes
from tandem.node.heartbeat import Heartbeat
from tandem.node.loop import NodeLoop
from tandem.node.metrics_server import MetricsServer

logger = logging.getLogger(__name__)

# What anyone who reaches the control port may read without the token: readiness, with the
# node's ports (routers read them). Probes and scrapes go to the metrics port, all public.
PUBLIC_PATHS = frozenset({"/health"})


class RoleLoop(Protocol):
    core: NodeCore
    publisher: KVEventPublisher

    def run_once(self) -> None: ...

    def ports(self) -> dict[str, int]:
        """The node's ZMQ ports by name (`events_port`, and `zmq_port` where it takes
        requests), reported by /health so routers need only the HTTP address."""
        ...

    def debug_report(self) -> dict[str, object]:
        """The role's own debug state, added to /debug/kv."""
        ...

    def close(self) -> None: ...


def token_check(token: DeploymentToken, metrics: Callable[[], Any]) -> Callable[..., None]:
    """A FastAPI dependency: 401 for a request to a non-public path that does not bear
    `token`, counted in `tandem_refused_inputs_total{reason="unauthenticated"}` once
    `metrics()` (the node's, None while loading) exists."""

    async def check(request: HttpRequest) -> None:
        if request.url.path in PUBLIC_PATHS or token.admits(request.headers.get("authorization")):
            return
        if (m := metrics()) is not None:
            m.child(m.refused_inputs, reason="unauthenticated").inc()
        raise HTTPException(401, "the deployment token is required (Authorization: Bearer)")

    return check


class NodeServer:
    """Owns the engine thread and the app. `build(loop)` makes the role's loop (`RoleLoop`)
    on that thread; the thread beats `heartbeat` at every turn of its loop; `token` guards
    every route but the public ones (off when empty)."""

    def __init__(
        self,
        build: Callable[[NodeLoop], RoleLoop],
        registry: CollectorRegistry,
        heartbeat: Heartbeat | None = None,
        debug_endpoints: bool = False,
        token: DeploymentToken | None = None,
    ) -> None:
        self.build = build
        self.registry = registry
        self.heartbeat = heartbeat or Heartbeat()
        self.loop = NodeLoop()
        self.role: RoleLoop | None = None
        self.ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        check = token_check(token or DeploymentToken(), self.node_metrics)
        self.app = FastAPI(lifespan=self._lifespan, dependencies=[Depends(check)])
        self.metrics_app = FastAPI(openapi_url=None)  # no /docs nor /openapi.json either
        self.metrics_port: int | None = None  # bound by `serve`
        self._add_routes()
        self._add_metrics_routes()
        add_debug_routes(self, debug_endpoints)

    def node_metrics(self) -> Any:
        """The node's `NodeMetrics`; None while the model loads."""
        return self.role.core.metrics if self.role is not None else None

    def not_ready(self) -> Response | None:
        """The 503 to answer while the model is loading, or None once it is ready."""
        if self.ready.is_set():
            return None
        return error_body("the model is still loading", 503, "service_unavailable")

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the engine thread and await its result."""
        return await asyncio.wrap_future(self.loop.call(fn))

    def _run(self) -> None:
        try:
            self.role = self.build(self.loop)
            self.heartbeat.beat()
            self.ready.set()
            logger.info("engine ready")
            while not self.loop.stopping.is_set():
                self.role.run_once()
                self.heartbeat.beat()
        except Exception:
            logger.exception("the engine thread died; exiting")
            os._exit(1)
        finally:
            if self.role is not None:
                self.role.close()

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: FastAPI) -> AsyncIterator[None]:
        self._thread.start()
        try:
            yield
        finally:
            self.loop.stop()
            await asyncio.to_thread(self._thread.join, 10)

    def _add_routes(self) -> None:
        app = self.app

        add_validation_handler(app)
        add_http_error_handler(app)

        app.get("/health")(self._health)

        @app.get("/kv/snapshot")
        async def kv_snapshot() -> Response:
            """Every cached block hash and the sequence number of the last KV-event batch
            they reflect: a router that missed events resynchronises from this."""
            if (busy := self.not_ready()) is not None:
                return busy
            return JSONResponse(await self.call(self._kv_snapshot))

    def _add_metrics_routes(self) -> None:
        app = self.metrics_app
        add_http_error_handler(app)
        app.get("/health")(self._health)
        app.get("/health/live")(self._live)
        app.get("/metrics")(self._metrics)

    async def _health(self) -> Response:
        """Ready (200) once the model is loaded, while the engine loop turns."""
        if not self.ready.is_set():
            return JSONResponse({"status": "loading"}, status_code=503)
        if (stalled := self._stalled()) is not None:
            return JSONResponse(stalled | self._identity(), status_code=503)
        return JSONResponse({"status": "ok"} | self._identity())

    async def _live(self) -> Response:
        """Alive (200) while the model loads and while the engine loop turns: the liveness
        probe restarts a node whose engine thread is stuck, never a loading one."""
        if (stalled := self._stalled()) is not None:
            return JSONResponse(stalled, status_code=503)
        return JSONResponse({"status": "ok" if self.ready.is_set() else "loading"})

    async def _metrics(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)

    def _stalled(self) -> dict[str, Any] | None:
        stalled_s = self.heartbeat.stalled_s()
        if stalled_s is None:
            return None
        return {"status": "engine stalled", "stalled_s": round(stalled_s, 3)}

    def _identity(self) -> dict[str, Any]:
        core = self.role.core
        identity = core.identity
        return {
            "role": identity.role,
            "model": identity.model,
            "revision": identity.revision,
            "agent": core.agent.name,
            "block_size": core.config.cache.block_size,
            **self.role.ports(),
            "metrics_port": self.metrics_port,
            # what a peer must match to pair with it (engine.wire): to tell why two don't
            "fingerprint": msgspec.structs.asdict(core.fingerprint),
        }

    def _kv_snapshot(self) -> dict[str, Any]:
        role = self.role
        pool = role.core.kv.pool
        snapshot = KVSnapshot(
            role.core.agent.name, role.publisher.seq, list(pool.cached), **role.core.tier_hashes()
        )
        return msgspec.structs.asdict(snapshot)

    def serve(self, host: str, port: int, metrics_port: int, log_level: str = "info") -> None:
        """Serve the metrics app on `metrics_port` (0: any free one) from a thread of its
        own, so probes and scrapes are answered however busy the control app's event loop
        is, and the control app on `port` until SIGINT or SIGTERM."""
        metrics = MetricsServer(self.metrics_app, host, metrics_port, log_level)
        self.metrics_port = metrics.port
        logger.info("metrics and health on port %d", metrics.port)
        metrics.start()
        config = uvicorn.Config(
            self.app, host=host, port=port, log_level=log_level, access_log=False,
            timeout_keep_alive=KEEP_ALIVE_S,
        )  # fmt: skip
        try:
            uvicorn.Server(config).run()
        finally:
            metrics.stop()
