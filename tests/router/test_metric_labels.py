"""No Tandem metric carries a label that the Prometheus Operator's PodMonitor gives every
target (`namespace`, `container`, `endpoint`, `job`, `instance`, `service`): Prometheus
keeps the target's and renames the scraped one `exported_<name>`, so a dashboard selecting
on it finds nothing (the router's `endpoint` label did that on the real node). `pod` is the
exception: the nodes set it to the pod's name, the value the target label has too."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tandem.engine.telemetry.metrics import NodeMetrics
from tandem.operator.metrics import OperatorMetrics
from tandem.router.metrics import RouterMetrics

TARGET_LABELS = {"namespace", "container", "endpoint", "job", "instance", "service"}


def label_names(registry: CollectorRegistry) -> dict[str, set[str]]:
    """Every metric's label names, declared ones included (a labelled metric exports no
    sample before its first child)."""
    found = {
        metric.name: {name for s in metric.samples for name in s.labels}
        for metric in registry.collect()
    }
    for collector, names in registry._collector_to_names.items():
        declared = set(getattr(collector, "_labelnames", ()))
        for name in names:
            found[name] = found.get(name, set()) | declared
    return found


@pytest.mark.parametrize("process", ["router", "prefill", "decode", "operator"])
def test_no_metric_label_is_a_target_label(process):
    registry = CollectorRegistry()
    if process == "router":
        RouterMetrics(registry, "m", "p")
    elif process == "operator":
        OperatorMetrics(registry)
    else:
        NodeMetrics(registry, "m", process, "p")
    clashes = {m: names & TARGET_LABELS for m, names in label_names(registry).items()}
    assert {m: c for m, c in clashes.items() if c} == {}
