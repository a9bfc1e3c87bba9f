"""The servers of the fault soak (`bench/soak.py`): a `tandem serve` process of its own and
its children, the metrics of every process that lived, and the nodes' KV censuses."""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tandem.engine.api.deployment_token import ENV as TOKEN_ENV
from tandem.engine.api.deployment_token import DeploymentToken
from tandem.engine.api.ports import free_port


class Serve:
    """A `tandem serve` process of our own; its output goes to `log`."""

    def __init__(self, args: argparse.Namespace, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-P", "-m", "tandem.cli", "serve", "--port", str(self.port)]
        cmd += ["--prefill", str(args.prefill), "--decode", str(args.decode)]
        cmd += ["--debug-endpoints"]  # the census reads every node's /debug/kv
        for flag in ("model", "max_model_len", "num_kv_blocks", "prefill_timeout", "hold_timeout"):
            if getattr(args, flag) is not None:
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        self.cmd = cmd
        self.proc: subprocess.Popen | None = None
        self.token = DeploymentToken.generate()  # its nodes' debug views answer only it

    def start(self) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", TOKEN_ENV: self.token.value}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT, env=env)

    async def wait_ready(self, http: httpx.AsyncClient, num_workers: int, timeout: float) -> None:
        """Until the router reports every worker healthy; RuntimeError if serve exits."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tandem serve exited with {self.proc.returncode}: {self.log}")
            try:
                workers = (await http.get(f"{self.url}/workers", timeout=5)).json()
                if sum(w["healthy"] for w in workers) == num_workers:
                    return
            except (httpx.HTTPError, ValueError):
                pass
            await asyncio.sleep(0.2)
        raise TimeoutError(f"tandem serve not ready in {timeout:g} s: {self.log}")

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in out.stdout.split()]

    def child(self, role: str) -> tuple[int, int]:
        """(pid, HTTP port) of this serve's first `role` node."""
        found = []
        for pid in self.children():
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
            if f"tandem.{role}_node" in argv:
                found.append((int(argv[argv.index("--http-port") + 1]), int(pid)))
        port, pid = min(found)
        return pid, port

    def restart_lines(self) -> list[str]:
        lines = self.log.read_text(errors="replace").splitlines()
        return [line for line in lines if line.startswith("tandem serve:")]

    def stop(self) -> dict:
        """SIGTERM, as a user's Ctrl-C; its exit code and the children it left running."""
        if self.proc is None or self.proc.poll() is not None:
            return {"exit_code": None if self.proc is None else self.proc.returncode}
        pids = self.children()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        left = [pid for pid in pids if Path(f"/proc/{pid}").exists()]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return {"exit_code": code, "children_left": left}


# -- metrics and censuses -------------------------------------------------------------------


class Ledger:
    """The last /metrics text of every process that lived, keyed (url, agent): a node's
    agent name changes when it restarts, so a killed process's counts are kept."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.texts: dict[tuple[str, str], str] = {}

    async def scrape(self, url: str) -> None:
        """The node now at `url`, filed under the agent its /health names before and after
        the read (a restart in between drops the reading; a dead node keeps its last)."""
        with contextlib.suppress(httpx.HTTPError, ValueError):
            health = await self._health(url)
            agent, port = health.get("agent"), health.get("metrics_port")
            host = httpx.URL(url).host
            text = (await self.http.get(f"http://{host}:{port}/metrics", timeout=10)).text
            if agent and (await self._health(url)).get("agent") == agent:
                self.texts[(url, agent)] = text

    async def _health(self, url: str) -> dict:
        return (await self.http.get(f"{url}/health", timeout=10)).json()

    async def scrape_router(self, url: str) -> None:
        with contextlib.suppress(httpx.HTTPError):
            self.texts[(url, "router")] = (await self.http.get(f"{url}/metrics", timeout=10)).text

    async def scrape_all(self, workers: list[dict]) -> None:
        await asyncio.gather(*(self.scrape(w["url"]) for w in workers))

    def served_since_restart(self, kill: dict) -> float:
        """Tokens a restarted process handled: prompt tokens (prefill) or generated ones."""
        name = "tandem_prompt_tokens_total"
        if kill["role"] == "decode":
            name = "tandem_generation_tokens_total"
        text = self.texts.get((kill["url"], kill.get("new_agent", "")), "")
        families = text_string_to_metric_families(text)
        return sum(s.value for f in families for s in f.samples if s.name == name)

    def totals(self, name: str, by: str, urls: set[str], **match: str) -> dict[str, float]:
        """Samples of `name` from the processes at `urls` whose labels include `match`,
        summed by their label `by`."""
        out: collections.Counter = collections.Counter()
        for (url, _), text in self.texts.items():
            if url not in urls:
                continue
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.name == name and match.items() <= s.labels.items():
                        out[",".join(s.labels.get(k, "") for k in by.split(","))] += s.value
        return dict(sorted(out.items()))


async def workers_of(http: httpx.AsyncClient, router: str) -> list[dict]:
    return (await http.get(f"{router}/workers", timeout=10)).json()


async def census(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> dict:
    try:
        r = await http.get(f"{url}/debug/kv", timeout=10, headers=headers)
        return r.json() if r.status_code == 200 else {"error": r.text[:200]}
    except (httpx.HTTPError, ValueError) as exc:
        return {"error": repr(exc)[:200]}


def balanced(c: dict) -> bool:
    return (
        "error" not in c
        and c["in_use"] == 0
        and c["held"] == 0
        and c["requests"] == 0
        and c["free"] + c["cached"] == c["total"]
    )


async def settle(
    http: httpx.AsyncClient, workers: list[dict], timeout: float, headers: dict[str, str]
) -> dict:
    """Poll every node's census (bearing `headers`) until all balance (or `timeout`)."""
    start = time.monotonic()
    while True:
        found = await asyncio.gather(*(census(http, w["url"], headers) for w in workers))
        censuses = {w["url"]: {"role": w["role"], **c} for w, c in zip(workers, found)}
        ok = all(balanced(c) for c in found)
        waited = time.monotonic() - start
        if ok or waited > timeout:
            return {"balanced": ok, "seconds": round(waited, 2), "nodes": censuses}
        await asyncio.sleep(0.2)
