"""Counters that move only on faults exist at 0 from a process's start, for every label
value the code can count, so a dashboard panel reads 0 rather than "No data"."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tandem.engine.telemetry.metrics import (
    DISAGG_DECISIONS,
    FALLBACK_REASONS,
    REFUSAL_REASONS,
    TRANSFER_FAILURE_REASONS,
    NodeMetrics,
)
from tandem.router.metrics import RETRY_REASONS, RouterMetrics

SERIES = {
    "prefill": [("tandem_num_preemptions_total", {})]
    + [("tandem_kv_transfer_failures_total", {"reason": r}) for r in TRANSFER_FAILURE_REASONS]
    + [("tandem_refused_inputs_total", {"reason": r}) for r in REFUSAL_REASONS["prefill"]],
    "decode": [("tandem_num_preemptions_total", {})]
    + [("tandem_prefill_fallbacks_total", {"reason": r}) for r in FALLBACK_REASONS]
    + [("tandem_disagg_decisions_total", {"decision": d}) for d in DISAGG_DECISIONS]
    + [("tandem_refused_inputs_total", {"reason": r}) for r in REFUSAL_REASONS["decode"]],
}


def samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    return {
        (
            s.name,
            frozenset((k, v) for k, v in s.labels.items() if k not in ("model", "pod")),
        ): s.value
        for metric in registry.collect()
        for s in metric.samples
    }


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_a_nodes_fault_counters_start_at_zero(role):
    found = samples(NodeMetrics(CollectorRegistry(), "m", role, "p").registry)
    for name, labels in SERIES[role]:
        assert found[(name, frozenset({"role": role, **labels}.items()))] == 0.0


def test_the_routers_retries_start_at_zero():
    metrics = RouterMetrics(CollectorRegistry(), "m", "r")
    text = generate_latest(metrics.registry).decode()
    for reason in RETRY_REASONS:
        assert f'reason="{reason}",role="router"}} 0.0' in text


def test_the_reasons_named_are_the_reasons_counted():
    """The label values above are the ones the workers pass (read from their source)."""
    from pathlib import Path

    import tandem.decode_node.node as decode
    import tandem.node.server as node_server
    import tandem.prefill_node.node as prefill
    import tandem.router.dispatch as dispatch

    fallback = Path(decode.__file__).read_text()
    assert all(f'self._fall_back(stream, "{r}"' in fallback for r in FALLBACK_REASONS)
    transfer = Path(prefill.__file__).read_text()
    assert all(f'transfer_failures, reason="{r}"' in transfer for r in TRANSFER_FAILURE_REASONS)
    both = Path(node_server.__file__).read_text()  # what every node's HTTP boundary counts
    prefill_node = transfer + Path(prefill.__file__).with_name("server.py").read_text() + both
    assert all(f'"{r}"' in prefill_node for r in REFUSAL_REASONS["prefill"])
    decode_node = fallback + Path(decode.__file__).with_name("server.py").read_text() + both
    assert all(f'"{r}"' in decode_node for r in REFUSAL_REASONS["decode"])
    routed = Path(dispatch.__file__).read_text()
    assert all(f'"{r}"' in routed for r in RETRY_REASONS)


def test_the_operators_reconcile_results_start_at_zero():
    from tandem.operator.metrics import RECONCILE_RESULTS, RECONCILE_TRIGGERS, OperatorMetrics

    found = samples(OperatorMetrics(CollectorRegistry()).registry)
    for trigger in RECONCILE_TRIGGERS:
        for result in RECONCILE_RESULTS:
            labels = frozenset({"trigger": trigger, "result": result}.items())
            assert found[("tandem_operator_reconciles_total", labels)] == 0.0


def test_the_reconcile_triggers_named_are_the_handlers_triggers():
    from pathlib import Path

    import tandem.operator.handlers as handlers
    from tandem.operator.metrics import RECONCILE_TRIGGERS

    source = Path(handlers.__file__).read_text()
    kopf_causes = [t for t in RECONCILE_TRIGGERS if t not in ("timer", "planner")]
    assert all(f'("{t}", kopf.on.{t})' in source for t in kopf_causes)
    assert 'reconcile("timer", body)' in source
    assert 'reconcile("planner", body)' in source  # the watch handler's, on a new threshold
