"""A second HTTP server in a node's process: the metrics app (`/metrics`, `/health`,
`/health/live`) on its own port, served by a thread with its own event loop."""

from __future__ import annotations

import threading

import uvicorn
from fastapi import FastAPI

# Seconds `stop` waits for the thread; it is a daemon, so the process never waits longer.
STOP_TIMEOUT_S = 5.0


class MetricsServer:
    """Serves `app` on `host:port` from a daemon thread. The port is bound in `__init__`,
    on the caller's thread, so a port in use ends the process before the engine starts
    (uvicorn logs it and exits) and port 0 is known (`port`) before `start`. The app runs
    without lifespan events: the control app's lifespan owns the engine thread."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                                access_log=False, lifespan="off")  # fmt: skip
        self.socket = config.bind_socket()
        self.port: int = self.socket.getsockname()[1]
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the server to finish its requests and stop; wait for it a bounded time."""
        self.server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S)
        self.socket.close()

    def _run(self) -> None:
        # uvicorn installs no signal handlers off the main thread: SIGTERM reaches the
        # control server, whose exit calls `stop`.
        self.server.run(sockets=[self.socket])
