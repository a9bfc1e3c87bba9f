"""Prometheus's pod discovery as the Prometheus Operator configures it for a PodMonitor:
`kubernetes_sd_configs` (role pod) against the suite's API server, then relabelling that
keeps the monitor's pods and port and gives every series `namespace`, `pod`, `container`,
`endpoint`, `job` and the monitor's `podTargetLabels`, then the endpoint's own
`relabelings`; one scrape job per endpoint."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

NO_PROMETHEUS = (
    "Debian's is built without it; set $TANDEM_PROMETHEUS to one that has it, or put it in "
    "$TANDEM_KUBE_BIN"
)


def kubernetes_prometheus() -> str | None:
    """A `prometheus` that knows `kubernetes_sd_configs`: $TANDEM_PROMETHEUS, else the one
    in $TANDEM_KUBE_BIN; None when neither is there."""
    found = os.environ.get("TANDEM_PROMETHEUS") or (
        str(Path(os.environ["TANDEM_KUBE_BIN"]) / "prometheus")
        if os.environ.get("TANDEM_KUBE_BIN")
        else None
    )
    if found is None or not Path(found).is_file():
        return None
    version = subprocess.run([found, "--version"], capture_output=True, text=True)
    return found if version.returncode == 0 else None


def label_name(key: str) -> str:
    """A Kubernetes label key as Prometheus names it (`tandem.dev/role` -> `tandem_dev_role`)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", key)


def pod_monitor_jobs(
    monitor: dict[str, Any], api_server: str, ca: Path, token_file: Path
) -> list[dict[str, Any]]:
    """The scrape configs for one PodMonitor object, one per endpoint (Tandem's: the
    nodes' `metrics` port, and the router's `http` port kept to the router by a
    relabeling)."""
    return [
        _endpoint_job(monitor, i, api_server, ca, token_file)
        for i in range(len(monitor["spec"]["podMetricsEndpoints"]))
    ]


def _endpoint_job(
    monitor: dict[str, Any], index: int, api_server: str, ca: Path, token_file: Path
) -> dict[str, Any]:
    meta, spec = monitor["metadata"], monitor["spec"]
    endpoint = spec["podMetricsEndpoints"][index]
    keep = [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_pod_label_{label_name(k)}",
                f"__meta_kubernetes_pod_labelpresent_{label_name(k)}",
            ],
            "regex": f"({re.escape(v)});true",
        }
        for k, v in spec["selector"]["matchLabels"].items()
    ]
    copy = {"namespace": "namespace", "pod_name": "pod", "pod_container_name": "container"}
    relabel = [
        *keep,
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
         "regex": "(Failed|Succeeded)"},
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
         "regex": endpoint["port"]},
        *({"source_labels": [f"__meta_kubernetes_{src}"], "target_label": dst}
          for src, dst in copy.items()),
        *({"source_labels": [f"__meta_kubernetes_pod_label_{label_name(k)}"],
           "target_label": label_name(k)} for k in spec.get("podTargetLabels", [])),
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
        {"target_label": "endpoint", "replacement": endpoint["port"]},
        *(_relabel(rule) for rule in endpoint.get("relabelings", [])),
    ]  # fmt: skip
    return {
        "job_name": f"podMonitor/{meta['namespace']}/{meta['name']}/{index}",
        "metrics_path": endpoint.get("path", "/metrics"),
        "kubernetes_sd_configs": [{
            "role": "pod", "api_server": api_server,
            "namespaces": {"names": [meta["namespace"]]},
            "tls_config": {"ca_file": str(ca)},
            "authorization": {"credentials_file": str(token_file)},
        }],
        "relabel_configs": relabel,
    }  # fmt: skip


def _relabel(rule: dict[str, Any]) -> dict[str, Any]:
    """A PodMonitor relabeling (camelCase fields) as Prometheus's relabel config."""
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return {names.get(k, k): v for k, v in rule.items()}
