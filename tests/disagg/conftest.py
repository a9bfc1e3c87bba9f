"""Real node processes shared by the disaggregation tests: two prefill workers and four
decode nodes (one for results, one whose deadlines pass in the tests, one that fails
instead of recomputing, and one with a tiny cache)."""

from __future__ import annotations

import pytest

from tests.disagg.nodes import Node, running

# `d` and `d_small` are for tests that need every remote prefill to succeed and every hold
# to end with the worker's answer: their deadlines are beyond anything a test waits for, so
# no remote prefill can fail over on a slow machine. `d_deadline` and `d_fail` are for the
# tests of the deadlines themselves (a paused worker times out): short enough to wait for,
# and still many times what a warm remote prefill takes on a loaded single core (~0.3 s).
NEVER = "600"
PREFILL_TIMEOUT = "5"
HOLD_TIMEOUT = "10"  # counted from an attempt's abandonment: outlives the worker's deadline


@pytest.fixture(scope="session")
def node_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("node-logs")


@pytest.fixture(scope="package")  # stopped once the package's tests are done
def cluster(llama_dir, node_logs):
    common = ("--max-num-batched-tokens", "256", "--max-model-len", "512")
    patient = (*common, "--prefill-timeout", NEVER, "--hold-timeout", NEVER)
    hasty = (*common, "--prefill-timeout", PREFILL_TIMEOUT, "--hold-timeout", HOLD_TIMEOUT)
    nodes = {
        "p1": Node("prefill", llama_dir, node_logs, *common, "--num-kv-blocks", "256"),
        "p2": Node("prefill", llama_dir, node_logs, *common, "--num-kv-blocks", "256"),
        "d": Node("decode", llama_dir, node_logs, *patient, "--num-kv-blocks", "256"),
        "d_deadline": Node("decode", llama_dir, node_logs, *hasty, "--num-kv-blocks", "256"),
        "d_fail": Node(
            "decode", llama_dir, node_logs, *hasty,
            "--num-kv-blocks", "64", "--on-prefill-failure", "fail",
        ),
        "d_small": Node("decode", llama_dir, node_logs, *patient, "--num-kv-blocks", "12"),
    }  # fmt: skip
    with running(nodes):
        yield nodes


@pytest.fixture
def spare_prefill(llama_dir, node_logs):
    """A prefill node of the test's own, to pause, kill or restart."""
    node = Node("prefill", llama_dir, node_logs, "--max-model-len", "512")
    yield node
    node.stop()
