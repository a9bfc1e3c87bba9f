"""A real Prometheus (Debian's `prometheus` package, installed by `make install`) on
127.0.0.1 for the tests: static or discovered scrape targets, rule files, and its HTTP query
API."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.bounds import HANG_S, PROCESS_S
from tests.disagg.nodes import free_port

SCRAPE_INTERVAL = "1s"


def binary(name: str) -> str:
    """The path of `prometheus` or `promtool`; AssertionError naming the fix if missing."""
    found = shutil.which(name)
    assert found, f"{name} is not installed: `make install` installs Debian's prometheus"
    return found


def static_jobs(jobs: dict[str, tuple[list[str], dict[str, str]]]) -> list[dict[str, Any]]:
    """Scrape configs for `jobs` ({job: (["host:port", ...], target labels)})."""
    return [
        {"job_name": job, "static_configs": [{"targets": targets, "labels": labels}]}
        for job, (targets, labels) in jobs.items()
    ]


class Prometheus:
    """One Prometheus process scraping by `scrape_configs` every second and evaluating
    `rule_files`."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: list[dict[str, Any]],
        rule_files: list[Path],
        program: str | None = None,  # else Debian's, from PATH
    ) -> None:
        self.workdir, self.program = workdir, program or binary("prometheus")
        self.port = free_port()
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": scrape_configs,
        }
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        log = open(self.workdir / "prometheus.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                self.program,
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        deadline = time.monotonic() + PROCESS_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.workdir / "prometheus.log").read_text()
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("prometheus not ready")

    def query(self, expr: str) -> dict[str, Any]:
        """The API's answer for an instant query now: `status` "success" with `data`, or
        "error" with `error` (a parse error, say)."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=HANG_S)
        return r.json()

    def series(self, expr: str) -> list[dict[str, Any]]:
        """The result of `expr`; AssertionError with the API's message when it fails."""
        answer = self.query(expr)
        assert answer["status"] == "success", (expr, answer.get("error"))
        return answer["data"]["result"]

    def api(self, path: str) -> Any:
        answer = httpx.get(f"{self.url}/api/v1/{path}", timeout=HANG_S).json()
        assert answer["status"] == "success", answer
        return answer["data"]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
