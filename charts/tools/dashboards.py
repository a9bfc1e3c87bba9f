"""Writes the Grafana dashboards of the chart (charts/tandem/dashboards/*.json).

    python charts/tools/dashboards.py          # regenerate
    python charts/tools/dashboards.py --check  # exit 1 if the files differ

    python charts/tools/dashboards.py --markdown  # the rows' table in docs/kubernetes.md

A real Prometheus evaluates every expression against running processes
(tests/router/test_prometheus.py); tests/operator checks the committed files equal this
output.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tandem" / "dashboards"
RATE = "[$__rate_interval]"
SEL = 'model=~"$model", namespace=~"$namespace"'
POD = f'{SEL}, pod=~"$pod"'
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
NODE_METRIC = "tandem_num_requests_running"
# every Tandem pod of the chosen models: routers, prefill and decode nodes
POD_SOURCE = (
    '{__name__=~"tandem_num_requests_running|tandem_router_requests_in_flight", '
    'model=~"$model", namespace=~"$namespace"}'
)
# Tandem's scrape targets, with the labels its PodMonitors add from the pods' labels
TARGETS = 'namespace=~"$namespace", tandem_dev_deployment!=""'
OPERATOR = "tandem_operator_leader"  # only the operator exports it: its process metrics
# the phases that add up to a disaggregated request's time to first token
# (tandem.router.phase_metrics.TTFT_PHASES; this script imports nothing of Tandem)
TTFT_PHASES = ("queue", "remote_prefill", "kv_transfer", "other")


def quantiles(
    metric: str, where: str = "", qs: tuple[str, ...] = ("50", "90", "99")
) -> list[tuple[str, str]]:
    sel = f"{SEL}, {where}" if where else SEL
    return [
        (f"p{q}", f"histogram_quantile(0.{q}, sum by (le) (rate({metric}_bucket{{{sel}}}{RATE})))")
        for q in qs
    ]


def rate(metric: str, by: str = "", where: str = "") -> str:
    sel = f"{SEL}, {where}" if where else SEL
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{{{sel}}}{RATE}))"


def or_zero(expr: str, traffic: str) -> str:
    """`expr`, or 0 while `traffic` has data: a status never answered has no series."""
    return f"({expr} or {traffic} * 0)"


def pooled(aggregate: str, metric: str, by: str) -> str:
    return f"{aggregate} by ({by}) ({metric}{{{SEL}}})"


def panel(title: str, targets: list[tuple[str, str]], unit: str = "short") -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": _targets(targets),
    }


def stat(title: str, expr: str, unit: str = "short") -> dict:
    """One number (the last value), for the service-level row."""
    return {
        "type": "stat",
        "title": title,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit, "decimals": 2}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}, "graphMode": "area"},
        "targets": _targets([(title, expr)]),
    }


def heatmap(title: str, metric: str, where: str = "", unit: str = "short") -> dict:
    """A histogram's buckets over time (counts per interval)."""
    sel = f"{SEL}, {where}" if where else SEL
    expr = f"sum by (le) (increase({metric}_bucket{{{sel}}}{RATE}))"
    target = {"refId": "A", "expr": expr, "legendFormat": "{{le}}", "format": "heatmap"}
    return {
        "type": "heatmap",
        "title": title,
        "datasource": DATASOURCE,
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {"calculate": False, "yAxis": {"unit": unit}, "color": {"scheme": "Oranges"}},
        "targets": [target],
    }


def _targets(targets: list[tuple[str, str]]) -> list[dict]:
    return [
        {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
        for i, (legend, expr) in enumerate(targets)
    ]


@dataclass(frozen=True)
class Row:
    """A titled row of panels and the question it answers (listed in docs/kubernetes.md)."""

    title: str
    question: str
    panels: list[dict]


def dashboard(uid: str, title: str, rows: list[Row], pod_variable: bool = True) -> dict:
    """Rows one under the other: stats 3 wide, other panels 12 wide, two to a line."""
    panels, y = [], 0
    for row in rows:
        panels.append(
            {
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "panels": [],
                "description": row.question,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        y += 1
        x = 0
        for p in row.panels:
            w, h = (3, 4) if p["type"] == "stat" else (12, 8)
            if x + w > 24:
                x, y = 0, y + h
            p["gridPos"] = {"h": h, "w": w, "x": x, "y": y}
            panels.append(p)
            x += w
        y += h
    for i, p in enumerate(panels):
        p["id"] = i + 1
    variables = [
        _datasource(),
        _variable("namespace", NODE_METRIC),
        _variable("model", NODE_METRIC),
    ]
    if pod_variable:
        variables.append(_variable("pod", POD_SOURCE))
    return {
        "uid": uid,
        "title": title,
        "tags": ["tandem"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables},
        "panels": panels,
    }


def _datasource() -> dict:
    return {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Source"}


def _variable(label: str, source: str) -> dict:
    return {
        "name": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": f"label_values({source}, {label})",
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }


def slo_row() -> Row:
    router = f'{SEL}, role="router"'
    generation = f'{{{SEL}, handler=~"/v1/.*"}}'
    requests = f"sum (rate(tandem_router_requests_total{generation}{RATE}))"
    failures = f"sum (rate(tandem_router_request_failures_total{{{SEL}}}{RATE}))"

    def p95(metric: str, where: str) -> str:
        return (
            f"histogram_quantile(0.95, sum by (le) (rate({metric}_bucket{{{SEL}, {where}}}{RATE})))"
        )

    return Row(
        "Service level",
        "Is the service meeting its objectives right now?",
        [
            stat("Requests/s", requests, "reqps"),
            stat(
                "Generated tokens/s",
                f"sum (rate(tandem_generation_tokens_total{{{router}}}{RATE}))",
            ),
            stat("TTFT p95", p95("tandem_time_to_first_token_seconds", 'role="router"'), "s"),
            stat("ITL p95", p95("tandem_inter_token_latency_seconds", 'role="decode"'), "s"),
            stat("E2E p95", p95("tandem_e2e_request_latency_seconds", 'role="router"'), "s"),
            stat("Error ratio", f"({failures} or {requests} * 0) / {requests}", "percentunit"),
            stat("Targets down", f"sum (1 - up{{{TARGETS}}})"),
            stat("Requests in flight", pooled("sum", "tandem_router_requests_in_flight", "model")),
        ],
    )


def overview() -> dict:
    router = 'role="router"'
    return dashboard("tandem-overview", "Tandem / Overview", [
        slo_row(),
        Row("Requests", "How many requests, how do they end, and which fail?", [
            panel("Requests by status", [
                ("{{status}}", rate("tandem_router_requests_total", "status", router))], "reqps"),
            panel("Errors", [
                (f"{c}xx", or_zero(rate("tandem_router_requests_total",
                                        where=f'{router}, status=~"{c}.."'),
                                   rate("tandem_router_requests_total", where=router)))
                for c in "45"
            ], "reqps"),
            panel("Finish reasons", [
                ("{{finish_reason}}",
                 rate("tandem_request_success_total", "finish_reason", router))], "reqps"),
            panel("Scrape targets down", [
                ("{{tandem_dev_role}}", f"sum by (tandem_dev_role) (1 - up{{{TARGETS}}})")]),
        ]),
        Row("Latency", "How long do users wait for the first token, each next one, the end?", [
            panel("Time to first token", quantiles("tandem_time_to_first_token_seconds", router),
                  "s"),
            panel("Inter-token latency", quantiles("tandem_inter_token_latency_seconds"), "s"),
            panel("End-to-end latency", quantiles("tandem_e2e_request_latency_seconds", router),
                  "s"),
            panel("Tokens per second", [
                ("prompt", rate("tandem_prompt_tokens_total", where=router)),
                ("generated", rate("tandem_generation_tokens_total", where=router)),
            ]),
        ]),
        Row("Lengths", "How long are prompts and replies, and how full are engine steps?", [
            heatmap("Prompt length", "tandem_request_prompt_tokens", router),
            heatmap("Generation length", "tandem_request_generation_tokens", router),
            heatmap("Tokens per engine step (prefill)", "tandem_iteration_tokens_total",
                    'role="prefill"'),
            heatmap("Tokens per engine step (decode)", "tandem_iteration_tokens_total",
                    'role="decode"'),
        ]),
        Row("Engines", "Are the pools keeping up: queues, KV cache, prefix cache, preemptions?", [
            panel("Queue per pool", [
                ("{{role}} waiting", pooled("sum", "tandem_num_requests_waiting", "role")),
                ("{{role}} running", pooled("sum", "tandem_num_requests_running", "role")),
            ]),
            panel("KV cache usage per pool", [
                ("{{role}} mean", pooled("avg", "tandem_kv_cache_usage_ratio", "role")),
                ("{{role}} max", pooled("max", "tandem_kv_cache_usage_ratio", "role")),
            ], "percentunit"),
            panel("Prefix cache hit rate per pool", [
                ("{{role}}", rate("tandem_prefix_cache_hits_total", "role")
                 + " / " + rate("tandem_prefix_cache_queries_total", "role")),
            ], "percentunit"),
            panel("Queue time and preemptions", [
                *quantiles("tandem_request_queue_time_seconds"),
                ("preemptions/s", rate("tandem_num_preemptions_total")),
            ], "s"),
        ]),
        kv_tiers_row(),
        Row("Per pod", "Which pod is the odd one out? (pick pods with the pod variable)", [
            panel("Requests running and waiting", [
                ("{{pod}} running", by_pod("sum", "tandem_num_requests_running")),
                ("{{pod}} waiting", by_pod("sum", "tandem_num_requests_waiting")),
            ]),
            panel("KV cache usage", [("{{pod}}", by_pod("max", "tandem_kv_cache_usage_ratio"))],
                  "percentunit"),
            panel("Generated tokens per second", [
                ("{{pod}}",
                 f"sum by (pod) (rate(tandem_generation_tokens_total{{{POD}}}{RATE}))")]),
            panel("Time to first token p95", [
                ("{{pod}}", "histogram_quantile(0.95, sum by (pod, le) "
                 f"(rate(tandem_time_to_first_token_seconds_bucket{{{POD}}}{RATE})))")], "s"),
            panel("CPU", [("{{pod}}", process_rate("process_cpu_seconds_total"))], "percentunit"),
            panel("Resident memory", [("{{pod}}", process("process_resident_memory_bytes"))],
                  "bytes"),
            panel("Open file descriptors", [("{{pod}}", process("process_open_fds"))]),
        ]),
        Row("GPUs", "Are the GPUs busy, full, hot? (NVIDIA dcgm-exporter metrics)", [
            panel("GPU utilization", [("{{pod}} {{gpu}}", gpu("DCGM_FI_DEV_GPU_UTIL"))], "percent"),
            panel("Tensor core activity", [
                ("{{pod}} {{gpu}}", gpu("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"))], "percentunit"),
            panel("GPU memory used", [("{{pod}} {{gpu}}", gpu("DCGM_FI_DEV_FB_USED"))],
                  "decmbytes"),
            panel("GPU power", [("{{pod}} {{gpu}}", gpu("DCGM_FI_DEV_POWER_USAGE"))], "watt"),
        ]),
    ])  # fmt: skip


def kv_tiers_row() -> Row:
    """The KV cache's tiers below the device (host memory, local disk), where a pool has them
    (`kvTiers`); `tier` is device, host or disk."""
    moved = "tandem_kv_tier_{}_moved_total"
    return Row("KV tiers", "Do the host and disk tiers keep the prefixes the device evicted, "
               "and how fast do they load back?", [
        panel("Prompt tokens found per tier", [
            ("{{role}} {{tier}}", rate("tandem_kv_tier_hits_total", "role, tier"))]),
        panel("Blocks moved per tier (down: stored, up: loaded)", [
            ("{{tier}} {{direction}}", rate(moved.format("blocks"), "tier, direction"))]),
        panel("Bytes moved per tier", [
            ("{{tier}} {{direction}}", rate(moved.format("bytes"), "tier, direction"))], "Bps"),
        panel("Load from lower tiers, per request",
              quantiles("tandem_kv_tier_load_seconds", qs=("50", "90")), "s"),
        panel("Tier occupancy per pool", [
            ("{{role}} {{tier}}", pooled("sum", "tandem_kv_tier_used_blocks", "role, tier")
             + " / " + pooled("sum", "tandem_kv_tier_capacity_blocks", "role, tier"))],
              "percentunit"),
    ])  # fmt: skip


def by_pod(aggregate: str, metric: str) -> str:
    return f"{aggregate} by (pod) ({metric}{{{POD}}})"


def process(metric: str) -> str:
    """A process metric (no model label: pods of the chosen model via $pod)."""
    return f'sum by (pod) ({metric}{{namespace=~"$namespace", pod=~"$pod"}})'


def process_rate(metric: str) -> str:
    return f'sum by (pod) (rate({metric}{{namespace=~"$namespace", pod=~"$pod"}}{RATE}))'


def gpu(metric: str) -> str:
    return f'avg by (pod, gpu) ({metric}{{namespace=~"$namespace", pod=~"$pod"}})'


def disaggregation() -> dict:
    phases = f'{SEL}, role="router", phase=~"{"|".join(TTFT_PHASES)}"'
    return dashboard("tandem-disaggregation", "Tandem / Disaggregation", [
        Row("TTFT breakdown",
            "Where does the time to first token of a disaggregated request go?", [
            panel("Mean time per phase (stacked: the mean TTFT)", [
                ("{{phase}}", f"sum by (phase) (rate(tandem_request_phase_seconds_sum{{{phases}}}"
                 f"{RATE})) / sum by (phase) (rate(tandem_request_phase_seconds_count"
                 f"{{{phases}}}{RATE}))")], "s"),
            panel("p95 per phase", [
                ("{{phase}}", "histogram_quantile(0.95, sum by (phase, le) (rate("
                 f'tandem_request_phase_seconds_bucket{{{SEL}, role="router"}}{RATE})))')], "s"),
        ]),
        Row("KV transfer", "Do KV blocks move from prefill to decode fast and without loss?", [
            panel("KV transfer time", quantiles("tandem_kv_transfer_seconds"), "s"),
            panel("KV transfer bandwidth", [
                ("{{role}}", rate("tandem_kv_transfer_bytes_total", "role"))], "Bps"),
            panel("KV blocks moved", [
                ("{{role}}", rate("tandem_kv_transfer_blocks_total", "role"))]),
            panel("KV transfer failures", [
                ("{{reason}}", rate("tandem_kv_transfer_failures_total", "reason"))]),
        ]),
        Row("Remote prefill", "How often is prefill remote, and how often does it fail over?", [
            panel("Remote vs local prefill", [
                ("{{decision}}", rate("tandem_disagg_decisions_total", "decision"))]),
            panel("Prefill fallbacks", [
                ("{{reason}}", rate("tandem_prefill_fallbacks_total", "reason"))]),
        ]),
        Row("Routing", "How does the router spread requests, and are its workers healthy?", [
            panel("Router: prefix blocks found on the chosen prefill worker", [
                ("blocks/s", rate("tandem_router_prefix_overlap_blocks_total"))]),
            panel("Router: selections per worker", [
                ("{{worker_role}} {{worker}}",
                 rate("tandem_router_worker_selections_total", "worker_role, worker"))]),
            panel("Router: retries", [
                ("{{reason}}", rate("tandem_router_retries_total", "reason"))]),
            panel("Router: healthy workers", [
                ("{{worker_role}}",
                 pooled("sum", "tandem_router_worker_healthy", "worker_role"))]),
        ]),
    ])  # fmt: skip


def operator() -> dict:
    """The operator's metrics carry no model label: no $model filter here."""

    def total(metric: str, by: str = "", where: str = "") -> str:
        group = f" by ({by})" if by else ""
        return f"sum{group} (rate({metric}{{{where}}}{RATE}))"

    reconciles = "tandem_operator_reconciles_total"
    return dashboard("tandem-operator", "Tandem / Operator", [
        Row("Reconciles", "Does the operator keep deployments in their wanted state?", [
            panel("Reconciles by result", [
                ("{{trigger}} {{result}}", total(reconciles, "trigger, result"))], "ops"),
            panel("Reconcile errors", [
                ("errors", total(reconciles, where='result="error"')),
                ("invalid specs", total(reconciles, where='result="invalid"')),
            ], "ops"),
            panel("Reconcile duration", [
                (f"p{q}", f"histogram_quantile(0.{q}, "
                          f"{total('tandem_operator_reconcile_seconds_bucket', 'le')})")
                for q in ("50", "99")], "s"),
            panel("Objects applied and pruned", [
                ("applied", total("tandem_operator_applied_objects_total")),
                ("pruned", total("tandem_operator_pruned_objects_total")),
            ], "ops"),
        ]),
        planner_row(),
        Row("Process", "Is the operator process itself healthy, and which replica leads?", [
            panel("Leader", [("{{pod}}", "max by (pod) (tandem_operator_leader)")]),
            panel("CPU", [("{{pod}}", f"sum by (pod) (rate(process_cpu_seconds_total{RATE})"
                                       f" and on (instance) {OPERATOR})")], "percentunit"),
            panel("Resident memory", [("{{pod}}", "sum by (pod) (process_resident_memory_bytes"
                                                   f" and on (instance) {OPERATOR})")], "bytes"),
        ]),
    ], pod_variable=False)  # fmt: skip


def planner_row() -> Row:
    """The SLO planners (`spec.slo`, docs/autoscaling.md): one series set per deployment."""
    ns = 'namespace=~"$namespace"'

    def latest(metric: str, by: str) -> str:
        return f"max by (deployment, {by}) ({metric}{{{ns}}})"

    def changes(metric: str, by: str) -> str:
        return f"sum by (deployment, {by}) (increase({metric}{{{ns}}}{RATE}))"

    decision = f"sum by (le) (rate(tandem_planner_decision_seconds_bucket{{{ns}}}{RATE}))"
    return Row("SLO planner", "Does each planned deployment get the replicas its SLOs need, "
               "and does the simulator agree with what the routers measure?", [
        panel("Replicas per pool (current, desired)", [
            ("{{deployment}} {{pool}} {{state}}",
             latest("tandem_planner_replicas", "pool, state"))]),
        panel("SLO attainment (measured; simulated: desired, current layout)", [
            ("{{deployment}} {{source}}", latest("tandem_planner_slo_attainment", "source"))],
              "percentunit"),
        panel("Simulator's error (measured / simulated - 1)", [
            ("{{deployment}} {{metric}}",
             latest("tandem_planner_prediction_error_ratio", "metric"))], "percentunit"),
        panel("Request rate planned for", [
            ("{{deployment}}", f"max by (deployment) (tandem_planner_request_rate{{{ns}}})")],
              "reqps"),
        panel("Decision time", [
            (f"p{q}", f"histogram_quantile(0.{q}, {decision})") for q in ("50", "99")], "s"),
        panel("Replica changes and intervals without a decision", [
            ("{{deployment}} {{pool}} {{direction}}",
             changes("tandem_planner_scalings_total", "pool, direction")),
            ("{{deployment}} failed: {{reason}}",
             changes("tandem_planner_failures_total", "reason")),
        ]),
    ])  # fmt: skip


def markdown() -> str:
    """The rows of every dashboard and their questions, for docs/kubernetes.md."""
    lines = ["| dashboard | row | the question it answers |", "| --- | --- | --- |"]
    for build in DASHBOARDS.values():
        board = build()
        for p in board["panels"]:
            if p["type"] == "row":
                lines.append(f"| {board['title']} | {p['title']} | {p['description']} |")
    return "\n".join(lines)


DASHBOARDS = {"overview": overview, "disaggregation": disaggregation, "operator": operator}


def render_all() -> dict[str, str]:
    return {
        f"{name}.json": json.dumps(build(), indent=2, sort_keys=True) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main(argv: list[str]) -> int:
    files = render_all()
    if "--markdown" in argv:
        print(markdown())
        return 0
    if "--check" in argv:
        stale = [n for n, text in files.items() if (OUT / n).read_text() != text]
        print("stale: " + ", ".join(stale) if stale else "dashboards up to date")
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
