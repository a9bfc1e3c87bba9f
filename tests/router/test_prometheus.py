"""The shipped dashboards and rules as users see them: a real Prometheus scrapes a running
`tandem serve --prefill 2 --decode 2` (and the operator's and a planner's metrics servers,
the planner's after one decision) while a short
mixed load runs (streamed, non-streamed, n=2, a cache hit, a bad request, an abort), then
every dashboard panel's expression, every dashboard variable and every recording rule must
parse and return at least one series, and every alert's signal too, unless listed below
with the condition the test does not create. `promtool check rules` on the rules file."""

from __future__ import annotations

import json
import re
import subprocess
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from tandem.node.metrics_server import MetricsServer
from tandem.operator.liveness import Health
from tandem.operator.metrics import OperatorMetrics, serve_probes
from tandem.planner.cli import metrics_app
from tandem.planner.layout_search import Layout
from tandem.planner.metrics import PlannerMetrics
from tandem.planner.planner import Decision
from tests.bounds import HANG_S, PROCESS_S
from tests.disagg.nodes import wait_until
from tests.operator.crd_schema import ROOT
from tests.router.conftest import SERVE_FLAGS, ServeProc
from tests.router.prometheus import Prometheus, binary, static_jobs

DASHBOARDS = ROOT / "charts" / "tandem" / "dashboards"
RULES = ROOT / "charts" / "tandem" / "rules" / "tandem.rules.yaml"
# Grafana's variables, as a user with "All" selected sees them
VARIABLES = {"$__rate_interval": "1m", "$model": ".*", "$namespace": ".*", "$pod": ".*"}

# "<dashboard> / <panel>" or "... / <panel> / <legend>" -> the condition it needs
NEEDS = {
    "Tandem / Overview / GPU utilization": "an NVIDIA GPU and dcgm-exporter",
    "Tandem / Overview / Tensor core activity": "an NVIDIA GPU and dcgm-exporter (profiling)",
    "Tandem / Overview / GPU memory used": "an NVIDIA GPU and dcgm-exporter",
    "Tandem / Overview / GPU power": "an NVIDIA GPU and dcgm-exporter",
    **dict.fromkeys(
        (
            f"Tandem / Overview / {panel}"
            for panel in (
                "Prompt tokens found per tier",
                "Blocks moved per tier (down: stored, up: loaded)",
                "Bytes moved per tier",
                "Load from lower tiers, per request",
                "Tier occupancy per pool",
            )
        ),
        "a node with a host or disk KV tier (--kv-host-gib, --kv-disk-gib)",
    ),
}
ALERTS_NEED: dict[str, str] = {}  # alert -> the condition its signal needs


def panels(board: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for p in board["panels"]:
        out += [p, *p.get("panels", [])]
    return out


def dashboard_queries() -> dict[str, str]:
    """{"<dashboard> / <panel> / <legend>": PromQL with the variables filled in}."""
    found = {}
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in panels(board):
            for target in panel.get("targets", []):
                key = f"{board['title']} / {panel['title']} / {target['legendFormat']}"
                found[key] = fill(target["expr"])
        for var in board["templating"]["list"]:
            if var["type"] == "query":  # label_values(metric, label): the metric's labels
                metric, label = re.fullmatch(r"label_values\((.*), (\w+)\)", var["query"]).groups()
                found[f"{board['title']} / ${var['name']}"] = f"count by ({label}) ({fill(metric)})"
    return found


def fill(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def needs(key: str) -> str | None:
    parts = key.split(" / ")
    return NEEDS.get(key) or NEEDS.get(" / ".join(parts[:3]))


def rules() -> tuple[dict[str, str], dict[str, str]]:
    """({recorded name: name}, {alert: its signal, the expression without its threshold})."""
    import yaml

    records, alerts = {}, {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                records[rule["record"]] = rule["record"]
            else:
                signal, _op, _threshold = re.fullmatch(
                    r"(.*) (==|>|<) (\S+)", rule["expr"]
                ).groups()
                alerts[rule["alert"]] = signal
    return records, alerts


def test_promtool_accepts_the_rules():
    out = subprocess.run(
        [binary("promtool"), "check", "rules", str(RULES)],
        capture_output=True, text=True, timeout=PROCESS_S,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def streamed_cached_tokens(http: httpx.Client, body: dict) -> int:
    """The prompt tokens a streamed request found in a prefix cache. The first request of a
    prompt may not have reached the router's KV index yet (KV events come on their own
    socket), so a repeat may go to the other decode node and miss; by the third, both have
    the prompt's blocks."""
    with http.stream("POST", "/v1/completions", json=body) as r:
        last = [line for line in r.iter_lines() if line.startswith("data: {")][-1]
    return json.loads(last[6:])["usage"]["prompt_tokens_details"]["cached_tokens"]


def mixed_load(url: str) -> None:
    """Non-streamed, streamed (a cache hit), chat, n=2, a bad request, an abort."""
    prompt = "The history of printing presses in Europe begins in Mainz. " * 3
    body = {"model": "llama", "prompt": prompt, "max_tokens": 6, "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=HANG_S) as http:
        assert http.post("/v1/completions", json=body).status_code == 200
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        assert wait_until(lambda: streamed_cached_tokens(http, streamed) > 0, interval=0.0)
        chat = {"model": "llama", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4, "stream": True}  # fmt: skip
        with http.stream("POST", "/v1/chat/completions", json=chat) as r:
            assert r.status_code == 200 and list(r.iter_lines())
        assert http.post("/v1/completions", json={**body, "n": 2}).status_code == 200
        assert http.post("/v1/completions", json={**body, "max_tokens": -1}).status_code == 400
        long = {**body, "max_tokens": 300, "stream": True}
        with http.stream("POST", "/v1/completions", json=long) as r:
            assert r.status_code == 200, r.read()
            next(line for line in r.iter_lines() if line.startswith("data: {"))
        # the client left after the first chunk: the router aborts the choice downstream


@pytest.mark.slow
def test_every_dashboard_query_and_rule_returns_series(llama_dir, router_logs, tmp_path):
    serve = ServeProc(llama_dir, router_logs, "--prefill", "2", "--decode", "2", *SERVE_FLAGS)
    operator = serve_probes(
        OperatorMetrics(CollectorRegistry()).registry, "127.0.0.1", 0, lambda: Health(True, "")
    )
    planner = planner_metrics_server()
    prometheus = None
    try:
        serve.start().wait_ready()
        assert wait_until(lambda: all(w["healthy"] for w in serve.workers()))
        workers = serve.workers()  # healthy: each node's metrics port is known
        # the target labels a PodMonitor gives: namespace, and the pods' tandem.dev labels
        jobs = {"operator": ([f"127.0.0.1:{operator.server_address[1]}"], {"namespace": "ops"})}
        planned = {"namespace": "ns", "tandem_dev_deployment": "llama"}
        jobs["llama-planner"] = (
            [f"127.0.0.1:{planner.port}"],
            planned | {"tandem_dev_role": "planner"},
        )
        urls = {"router": [serve.url]}
        for w in workers:  # a node's metrics port (its control port serves no /metrics)
            urls.setdefault(w["role"], []).append(w["metrics_url"].removesuffix("/metrics"))
        assert len(urls["prefill"]) == len(urls["decode"]) == 2
        for role, found in urls.items():
            labels = {"namespace": "ns", "tandem_dev_deployment": "llama", "tandem_dev_role": role}
            jobs[f"llama-{role}"] = ([u.removeprefix("http://") for u in found], labels)
        prometheus = Prometheus(tmp_path, static_jobs(jobs), [RULES]).start()
        mixed_load(serve.url)
        check(prometheus)
    finally:
        if prometheus is not None:
            prometheus.stop()
        operator.shutdown()
        planner.stop()
        serve.stop()


def planner_metrics_server() -> MetricsServer:
    """A planner's metrics server (`tandem planner`'s app) after one decision that scaled
    decode up."""
    registry = CollectorRegistry()
    decision = Decision(
        current=Layout(1, 1), planned=Layout(1, 2), target=Layout(1, 2), reason="test",
        predicted_attainment=0.95, measured_attainment=0.5, current_attainment=0.6,
        rate_rps=3.0, search_s=1.5, simulations=4, errors={"ttft": 0.2, "tpot": -0.1},
    )  # fmt: skip
    PlannerMetrics(registry, "llama").observe(decision, {"decode": 1.2, "prefill": 0.9})
    server = MetricsServer(metrics_app(registry), "127.0.0.1", 0, log_level="warning")
    server.start()
    return server


def check(prometheus: Prometheus) -> None:
    queries = dashboard_queries()
    records, alerts = rules()
    expected = {k: q for k, q in queries.items() if needs(k) is None}
    expected |= {f"record {name}": name for name in records}
    expected |= {f"alert {a}": s for a, s in alerts.items() if a not in ALERTS_NEED}
    # the abort: the router saw the client leave, the decode node aborted the request
    expected |= {
        f"abort seen by {role}": (
            f'tandem_request_success_total{{finish_reason="abort", role="{role}"}}'
        )
        for role in ("router", "decode")
    }
    start = time.monotonic()

    def empty() -> list[str]:
        return [key for key, q in expected.items() if not prometheus.series(q)]

    # wait for a state: every scrape and rule evaluation the load makes visible
    wait_until(lambda: not empty(), timeout=HANG_S, interval=1.0)
    print(f"all series present {time.monotonic() - start:.1f} s after the load")
    assert empty() == []
    # the rest parse, and the Tandem metrics they name were scraped (help and type, no
    # samples yet); dcgm-exporter's are not Tandem's
    metadata = prometheus.api("metadata")
    for key, q in queries.items():
        if needs(key) is not None:
            prometheus.series(q)
            names = set(re.findall(r"\b(tandem_[a-z0-9_]+?)(?:_bucket|_total)?\b", q))
            assert all(n in metadata or f"{n}_total" in metadata for n in names), key
    for signal in alerts.values():
        prometheus.series(signal)  # parses
    groups = prometheus.api("rules")["groups"]
    loaded = [r for g in groups for r in g["rules"]]
    assert len(loaded) == len(records) + len(alerts)
    assert all(r["health"] == "ok" for r in loaded), [r for r in loaded if r["health"] != "ok"]
    down = prometheus.series("up == 0")
    assert down == [], down
    expected |= {f"alert {a}": s for a, s in alerts.items() if a not in ALERTS_NEED}
    # the abort: the router saw the client leave, the decode node aborted the request
    expected |= {
        f"abort seen by {role}": (
            f'tandem_request_success_total{{finish_reason="abort", role="{role}"}}'
        )
        for role in ("router", "decode")
    }
