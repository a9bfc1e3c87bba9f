"""Real node processes shared by the disaggregation tests: two prefill workers and three
decode nodes (fail over by recompute, fail over by failing, and one with a tiny cache)."""

from __future__ import annotations

import pytest

from tests.disagg.nodes import Node, running

PREFILL_TIMEOUT = "2"
HOLD_TIMEOUT = "5"


@pytest.fixture(scope="session")
def node_logs(tmp_path_factory):
    return tmp_path_factory.mktemp("node-logs")


@pytest.fixture(scope="package")  # stopped once the package's tests are done
def cluster(llama_dir, node_logs):
    common = ("--max-num-batched-tokens", "256", "--max-model-len", "512")
    decode_flags = ("--prefill-timeout", PREFILL_TIMEOUT, "--hold-timeout", HOLD_TIMEOUT)
    nodes = {
        "p1": Node("prefill", llama_dir, node_logs, *common, "--num-kv-blocks", "256"),
        "p2": Node("prefill", llama_dir, node_logs, *common, "--num-kv-blocks", "256"),
        "d": Node("decode", llama_dir, node_logs, *common, *decode_flags, "--num-kv-blocks", "256"),
        "d_fail": Node(
            "decode", llama_dir, node_logs, *common, *decode_flags,
            "--num-kv-blocks", "64", "--on-prefill-failure", "fail",
        ),
        "d_small": Node("decode", llama_dir, node_logs, *common, *decode_flags,
                        "--num-kv-blocks", "12"),
    }  # fmt: skip
    with running(nodes):
        yield nodes


@pytest.fixture
def spare_prefill(llama_dir, node_logs):
    """A prefill node of the test's own, to pause, kill or restart."""
    node = Node("prefill", llama_dir, node_logs, "--max-model-len", "512")
    yield node
    node.stop()
