"""EndpointSliceDiscovery through the real Kubernetes client, against a local HTTP server
that replays the recorded list (no cluster needed)."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

from tandem.router.discovery import EndpointSliceDiscovery
from tests.kubeconfig import write_kubeconfig

RECORDED = (Path(__file__).parent / "fixtures" / "endpointslices.json").read_bytes()


@pytest.fixture
def api_server():
    seen: list[tuple[str, dict]] = []

    class Replay(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlsplit(self.path)
            seen.append((url.path, parse_qs(url.query)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(RECORDED)))
            self.end_headers()
            self.wfile.write(RECORDED)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", seen
    server.shutdown()


def test_lists_the_selected_slices_and_caches_the_answer(api_server, tmp_path, monkeypatch):
    url, seen = api_server
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path, url, "t")))
    # refresh_s beyond the test: the second call reuses the answer however slow the machine
    discovery = EndpointSliceDiscovery(
        "tandem.dev/deployment=chat", namespace="llm", refresh_s=3600
    )
    found = asyncio.run(discovery.addresses())
    assert [(a.role, a.url) for a in found][-1] == ("prefill", "http://10.244.1.17:8080")
    assert len(found) == 4
    path, query = seen[0]
    assert path == "/apis/discovery.k8s.io/v1/namespaces/llm/endpointslices"
    assert query["labelSelector"] == ["tandem.dev/deployment=chat"]
    asyncio.run(discovery.addresses())
    assert len(seen) == 1  # within refresh_s the last answer is reused
