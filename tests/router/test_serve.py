"""`tandem serve` as a supervisor: the default model it writes, a crashed child restarted on
its ports (a new agent the router takes back), and a child that crashes more often than
allowed stopping everything. (SIGTERM stopping every child, a restarted one included, is
checked by the soak's smoke test, `test_soak.py`; SIGINT alone, here.)"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import openai
import pytest

from tandem.router.serve import ensure_model
from tests.bounds import HANG_S, PROCESS_S
from tests.disagg.nodes import wait_until
from tests.router.conftest import ServeProc

FLAGS = ("--prefill", "0", "--decode", "1", "--max-model-len", "256", "--num-kv-blocks", "64")


def test_without_a_model_it_writes_the_small_one_once(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = ensure_model(None)
    assert path == tmp_path / "tandem" / "tiny-llama"
    assert (path / "config.json").is_file() and (path / "tokenizer.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert ensure_model(None) == path and (path / "config.json").stat().st_mtime_ns == stamp


def children(serve: ServeProc) -> dict[str, int]:
    """The serve's live children by module (`tandem.decode_node`, `tandem.router`)."""
    pids = subprocess.run(
        ["pgrep", "-P", str(serve.proc.pid)], capture_output=True, text=True, check=False
    ).stdout.split()
    found = {}
    for pid in pids:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        found[argv[argv.index(b"-m") + 1].decode()] = int(pid)
    return found


def alive(pids) -> bool:
    out = subprocess.run(["ps", "-o", "pid=", "-p", ",".join(map(str, pids))], capture_output=True)
    return out.stdout.strip() != b""


def complete(serve: ServeProc) -> int:
    client = openai.OpenAI(base_url=f"{serve.url}/v1", api_key="x", max_retries=0)
    r = client.completions.create(
        model="llama", prompt="Hi", max_tokens=3, extra_body={"ignore_eos": True}
    )
    return r.usage.completion_tokens


def test_a_crashed_child_is_restarted_until_it_crashes_too_often(llama_dir, router_logs):
    serve = ServeProc(llama_dir, router_logs, *FLAGS, "--max-restarts", "1",
                      "--restart-window", "3600")  # fmt: skip
    try:
        serve.start().wait_ready()
        assert complete(serve) == 3  # no prefill worker: the decode node prefilled
        (decode,) = serve.workers("decode")
        first = children(serve)
        assert first.keys() == {"tandem.decode_node", "tandem.router"}
        subprocess.run(["kill", "-9", str(first["tandem.decode_node"])], check=True)

        def back() -> bool:
            (now,) = serve.workers("decode")
            return now["healthy"] and now["agent"] != decode["agent"]

        # restarted on its ports as a new agent, which the router takes back
        assert wait_until(back, timeout=PROCESS_S), "the decode node was not restarted"
        assert complete(serve) == 3
        second = children(serve)
        assert second["tandem.router"] == first["tandem.router"]
        assert second["tandem.decode_node"] != first["tandem.decode_node"]
        # a second crash within the window is one more than allowed: everything stops
        subprocess.run(["kill", "-9", str(second["tandem.decode_node"])], check=True)
        assert serve.proc.wait(HANG_S) == 1
        assert not alive(second.values())
        log = (router_logs / f"serve-{serve.http_port}.log").read_text()
        assert "decode-0 restarted" in log and "2 crashes within 3600 s" in log, log[-2000:]
    finally:
        serve.stop()


def test_sigint_alone_stops_serve_and_every_child_though_it_started_ignored(llama_dir, router_logs):
    """`kill -INT` to the serve process (not its group) stops everything, like SIGTERM. A
    background job of a non-interactive shell starts with SIGINT ignored, and Python keeps
    an ignored SIGINT unless the program sets a handler: serve did not, and kept running."""
    serve = ServeProc(llama_dir, router_logs, *FLAGS)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # inherited, as from a shell
    try:
        serve.start()
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        serve.wait_ready()
        started = children(serve)
        assert started.keys() == {"tandem.decode_node", "tandem.router"}
        serve.proc.send_signal(signal.SIGINT)
        assert serve.proc.wait(HANG_S) == 0
        assert not alive(started.values())
    finally:
        serve.stop()


def test_tandem_serve_tells_prefill_nodes_the_decode_nodes_tensor_parallel_size():
    """So a prefill node plans the staging mirrors a finer split of the heads needs."""
    import argparse
    from pathlib import Path

    from tandem.router.serve import add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(
        ["--prefill", "1", "--decode", "1", "--decode-tensor-parallel-size", "2"]
    )
    prefill = next(c for c in plan(args, Path("model")) if c.name == "prefill-0")
    at = prefill.cmd.index("--peer-tensor-parallel-sizes")
    assert prefill.cmd[at + 1] == "2"


@pytest.mark.parametrize(("flags", "dtype"), [([], "auto"), (["--dtype", "float32"], "float32")])
def test_tandem_serve_gives_every_node_its_dtype(flags, dtype):
    import argparse

    from tandem.router.serve import add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    children = plan(parser.parse_args(["--prefill", "2", *flags]), Path("model"))
    nodes = [c for c in children if c.name != "router"]
    assert len(nodes) == 3
    for node in nodes:
        assert node.cmd[node.cmd.index("--dtype") + 1] == dtype
    with pytest.raises(SystemExit):
        parser.parse_args(["--dtype", "float8"])


@pytest.mark.parametrize(
    ("flags", "nodes"), [(["--prefill", "0"], 1), ([], 2), (["--prefill", "3", "--decode", "2"], 5)]
)
def test_tandem_serve_shares_the_cpus_among_its_nodes(flags, nodes):
    import argparse
    import os

    from tandem.router.serve import add_arguments, plan

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    expected = max(1, len(os.sched_getaffinity(0)) // nodes)
    for args, threads in ((flags, expected), ([*flags, "--threads", "3"], 3)):
        children = [c for c in plan(parser.parse_args(args), Path("model")) if c.name != "router"]
        assert len(children) == nodes
        assert {c.cmd[c.cmd.index("--threads") + 1] for c in children} == {str(threads)}
