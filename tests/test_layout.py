"""The package layout of design §2 and the `tandem` command."""

from __future__ import annotations

import ast
import importlib
import operator
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPONENTS = [
    "cli",
    "engine",
    "kernels",
    "node",
    "prefill_node",
    "decode_node",
    "router",
    "operator",
    "sim",
]


@pytest.mark.parametrize("folder", COMPONENTS)
def test_each_folder_is_a_tandem_subpackage(folder):
    module = importlib.import_module(f"tandem.{folder}")
    assert Path(module.__file__).resolve().parent == ROOT / folder


def test_the_standard_operator_module_is_untouched():
    assert Path(operator.__file__).parent != ROOT / "operator"
    assert hasattr(operator, "itemgetter")


def test_engine_never_imports_a_component_above_it():
    code = (
        "import sys, tandem.engine; "
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in "
        "(['tandem','router'], ['tandem','prefill_node'], ['tandem','decode_node'], "
        "['tandem','operator'], ['tandem','sim'], ['tandem','node'], ['tandem','cli'])))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_simulator_uses_only_the_router_and_the_engine():
    code = (
        "import sys, tandem.sim.cli, tandem.sim.cluster; "
        "print(sorted({'.'.join(m.split('.')[:2]) for m in sys.modules "
        "if m.startswith('tandem.')}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(ast.literal_eval(out.stdout))
    assert {"tandem.engine", "tandem.router", "tandem.sim"} <= loaded
    assert not loaded & {"tandem.prefill_node", "tandem.decode_node", "tandem.operator"}


def test_tandem_make_model_command(tmp_path):
    exe = shutil.which("tandem", path=str(Path(sys.executable).parent))
    assert exe is not None, "the console script is installed with the project"
    subprocess.run(
        [exe, "make-model", str(tmp_path / "m"), "--arch", "mistral"],
        check=True,
        capture_output=True,
    )
    assert (tmp_path / "m" / "config.json").is_file()
    assert (tmp_path / "m" / "tokenizer.json").is_file()
    assert (tmp_path / "m" / "model.safetensors").is_file()
