"""What each entry point loads (design §2): the operator renders Kubernetes objects and
imports no serving code and no torch; `tandem` imports only the subcommand that runs."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "crds" / "examples" / "minimal.yaml"
HEAVY = ("torch", "transformers", "triton")


def loaded_after(code: str) -> set[str]:
    """Modules in `sys.modules` after `code` runs in a fresh interpreter (SystemExit too)."""
    probe = (
        "import sys\n"
        f"try:\n    exec({code!r})\nexcept SystemExit:\n    pass\n"
        "sys.stderr.write('\\nLOADED ' + ' '.join(sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-P", "-c", probe], capture_output=True, text=True, timeout=300
    )
    assert "\nLOADED " in result.stderr, result.stderr
    return set(result.stderr.rsplit("\nLOADED ", 1)[1].split())


def test_the_operator_imports_no_serving_code_and_no_torch():
    names = [m.name for m in pkgutil.iter_modules([str(ROOT / "operator")]) if m.name != "__main__"]
    imports = "; ".join(f"import tandem.operator.{name}" for name in names)
    loaded = loaded_after(imports)
    assert "tandem.operator.handlers" in loaded and "kopf" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))
    serving = {m for m in loaded if m.startswith("tandem.") and m.split(".")[1] != "operator"} - {
        "tandem.engine",
        "tandem.engine.api",
        "tandem.engine.api.kube_config",
        "tandem.engine.api.deployment_token",  # stdlib only: the token's variable, shared with pods
    }
    assert not serving, sorted(serving)


def test_tandem_operator_render_runs_without_torch():
    code = f"from tandem.cli import main; main(['operator', '--render', {str(EXAMPLE)!r}])"
    loaded = loaded_after(code)
    assert "tandem.operator.render" in loaded
    assert not loaded & set(HEAVY), sorted(loaded & set(HEAVY))


def test_tandem_imports_only_the_subcommand_that_runs():
    top = loaded_after("from tandem.cli import main; main(['--help'])")
    assert not {m for m in top if m.startswith("tandem.") and m != "tandem.cli"} - {"tandem.engine"}
    make_model = loaded_after("from tandem.cli import main; main(['make-model', '--help'])")
    assert "tandem.engine.tiny_model" in make_model
    assert not {m for m in make_model if m.split(".")[:2] in (["tandem", "router"],
                                                            ["tandem", "operator"])}  # fmt: skip


def test_help_lists_every_subcommand():
    result = subprocess.run(
        [sys.executable, "-P", "-m", "tandem.cli", "--help"],
        capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    names = ("make-model", "generate", "prefill", "decode", "router", "serve", "operator")
    for name in (*names, "simulate", "plan"):
        assert name in result.stdout
