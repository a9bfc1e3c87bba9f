"""Writes the Grafana dashboards of the chart (charts/tandem/dashboards/*.json).

    python charts/tools/dashboards.py          # regenerate
    python charts/tools/dashboards.py --check  # exit 1 if the files differ

Every expression names metrics Tandem exports (design §7); tests/operator checks the names
against the code's registries and that the committed files equal this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tandem" / "dashboards"
RATE = "[$__rate_interval]"
SEL = 'model=~"$model", namespace=~"$namespace"'


def quantiles(metric: str, where: str = "") -> list[tuple[str, str]]:
    sel = f"{SEL}, {where}" if where else SEL
    return [
        (f"p{q}", f"histogram_quantile(0.{q}, sum by (le) (rate({metric}_bucket{{{sel}}}{RATE})))")
        for q in ("50", "90", "99")
    ]


def rate(metric: str, by: str = "", where: str = "") -> str:
    sel = f"{SEL}, {where}" if where else SEL
    group = f" by ({by})" if by else ""
    return f"sum{group} (rate({metric}{{{sel}}}{RATE}))"


def pooled(aggregate: str, metric: str, by: str) -> str:
    return f"{aggregate} by ({by}) ({metric}{{{SEL}}})"


def panel(title: str, targets: list[tuple[str, str]], unit: str = "short") -> dict:
    return {
        "type": "timeseries",
        "title": title,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "targets": [
            {"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend}
            for i, (legend, expr) in enumerate(targets)
        ],
    }


def dashboard(uid: str, title: str, panels: list[dict]) -> dict:
    for i, p in enumerate(panels):
        p["id"] = i + 1
        p["gridPos"] = {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}
    return {
        "uid": uid,
        "title": title,
        "tags": ["tandem"],
        "timezone": "browser",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [_datasource(), _variable("namespace"), _variable("model")]},
        "panels": panels,
    }


def _datasource() -> dict:
    return {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Source"}


def _variable(label: str) -> dict:
    return {
        "name": label,
        "type": "query",
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "query": f"label_values(tandem_num_requests_running, {label})",
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {"text": "All", "value": "$__all"},
        "refresh": 2,
    }


def overview() -> dict:
    router = 'role="router"'
    return dashboard("tandem-overview", "Tandem / Overview", [
        panel("Requests by status", [
            ("{{status}}", rate("tandem_router_requests_total", "status", router))], "reqps"),
        panel("Errors", [
            ("4xx", rate("tandem_router_requests_total", where=f'{router}, status=~"4.."')),
            ("5xx", rate("tandem_router_requests_total", where=f'{router}, status=~"5.."')),
        ], "reqps"),
        panel("Time to first token", quantiles("tandem_time_to_first_token_seconds", router), "s"),
        panel("Inter-token latency", quantiles("tandem_inter_token_latency_seconds"), "s"),
        panel("End-to-end latency", quantiles("tandem_e2e_request_latency_seconds", router), "s"),
        panel("Tokens per second", [
            ("prompt", rate("tandem_prompt_tokens_total", where=router)),
            ("generated", rate("tandem_generation_tokens_total", where=router)),
        ]),
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
    ])  # fmt: skip


def disaggregation() -> dict:
    return dashboard("tandem-disaggregation", "Tandem / Disaggregation", [
        panel("KV transfer time", quantiles("tandem_kv_transfer_seconds"), "s"),
        panel("KV transfer bandwidth", [
            ("{{role}}", rate("tandem_kv_transfer_bytes_total", "role"))], "Bps"),
        panel("KV blocks moved", [("{{role}}", rate("tandem_kv_transfer_blocks_total", "role"))]),
        panel("KV transfer failures", [
            ("{{reason}}", rate("tandem_kv_transfer_failures_total", "reason"))]),
        panel("Remote vs local prefill", [
            ("{{decision}}", rate("tandem_disagg_decisions_total", "decision"))]),
        panel("Prefill fallbacks", [
            ("{{reason}}", rate("tandem_prefill_fallbacks_total", "reason"))]),
        panel("Router: prefix blocks found on the chosen prefill worker", [
            ("blocks/s", rate("tandem_router_prefix_overlap_blocks_total"))]),
        panel("Router: selections per worker", [
            ("{{worker_role}} {{worker}}",
             rate("tandem_router_worker_selections_total", "worker_role, worker"))]),
        panel("Router: retries", [("{{reason}}", rate("tandem_router_retries_total", "reason"))]),
        panel("Router: healthy workers", [
            ("{{worker_role}}",
             pooled("sum", "tandem_router_worker_healthy", "worker_role"))]),
    ])  # fmt: skip


def operator() -> dict:
    """The operator's metrics carry no model label: no $model filter here."""

    def total(metric: str, by: str = "", where: str = "") -> str:
        group = f" by ({by})" if by else ""
        return f"sum{group} (rate({metric}{{{where}}}{RATE}))"

    reconciles = "tandem_operator_reconciles_total"
    return dashboard("tandem-operator", "Tandem / Operator", [
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
        panel("Leader", [("{{pod}}", "max by (pod) (tandem_operator_leader)")]),
    ])  # fmt: skip


DASHBOARDS = {"overview": overview, "disaggregation": disaggregation, "operator": operator}


def render_all() -> dict[str, str]:
    return {
        f"{name}.json": json.dumps(build(), indent=2, sort_keys=True) + "\n"
        for name, build in DASHBOARDS.items()
    }


def main(argv: list[str]) -> int:
    files = render_all()
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
