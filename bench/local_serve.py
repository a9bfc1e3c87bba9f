"""A `tandem serve` on this machine for a benchmark: started, waited for until the router
sees every worker healthy, its log kept in a file (a pipe nobody reads fills up, 64 KiB, a
few lines per request from five processes, and blocks the processes that write to it) and
printed if the benchmark fails, stopped at the end."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.api.deployment_token import DeploymentToken


@contextmanager
def local_serve(command: list[str], base: str, num_workers: int) -> Iterator[subprocess.Popen]:
    """`command` (a `tandem serve` with one torch thread per node) serving at `base`, ready.
    Its deployment token is this process's `$TANDEM_AUTH_TOKEN`, made here when unset, so
    that `node_headers()` open the nodes' debug views."""
    os.environ.setdefault(TOKEN_ENV, DeploymentToken.generate().value)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_ready(base, proc, log, num_workers)
            yield proc
        except Exception:
            log.seek(0)
            print(f"tandem serve's log ends:\n{log.read().decode()[-4000:]}", file=sys.stderr)
            raise
        finally:
            proc.terminate()
            proc.wait(60)


def node_headers() -> dict[str, str]:
    """What a call to a node's control or debug routes bears (see `local_serve`)."""
    return DeploymentToken.from_env().headers()


def wait_ready(base: str, proc: subprocess.Popen, log, num_workers: int) -> None:
    """Until the router sees every worker healthy."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"tandem serve exited: {log.read().decode()[-2000:]}")
        try:
            workers = httpx.get(f"{base}/workers", timeout=2).json()
            if sum(1 for w in worker_entries(workers) if w.get("healthy")) == num_workers:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("tandem serve not ready")


def worker_entries(workers) -> list[dict]:
    """The entries of the router's `GET /workers` answer."""
    return workers if isinstance(workers, list) else workers.get("workers", [])
