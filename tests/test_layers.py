"""The import rule (design §2), per package: a module imports only packages of lower layers
and its own. The edges are read from the source by bench/import_graph.py (every import, also
inside functions; not those under `TYPE_CHECKING`), so a lazy import cannot hide an upward
edge."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# bench/import_graph.py reads the edges (and draws them); bench/ is scripts, not a package
_spec = importlib.util.spec_from_file_location("import_graph", ROOT / "bench" / "import_graph.py")
import_graph = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(import_graph)

# Low to high. A package imports only packages of lower layers and itself: two packages in
# one layer never import each other. `engine` alone is the engine's own top: the runner
# that drives the ranks and the offline engine (`LLM`, `LLMEngine`).
LAYERS: list[set[str]] = [
    {"kernels"},
    {"engine.structured"},
    {"engine.core"},
    {"engine.api", "engine.telemetry", "engine.attention"},
    {"engine.models"},
    {"engine.exec"},
    {"engine.transfer"},
    {"engine.parallel"},
    {"engine"},
    {"node", "router"},
    {"prefill_node", "decode_node", "sim", "operator"},
    {"planner"},
    {"cli"},
]
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}


@functools.cache
def edges() -> list[tuple[str, str, str]]:
    return import_graph.edges(ROOT)


def test_every_package_has_a_layer():
    packages = {
        import_graph.package_of(import_graph.module_of(p))
        for folder in import_graph.SOURCES
        for p in (ROOT / folder).rglob("*.py")
    }
    assert packages == set(LAYER), sorted(packages ^ set(LAYER))


@pytest.mark.parametrize("package", sorted(LAYER))
def test_a_package_imports_only_lower_layers(package):
    upward = [
        f"{path} ({source}) imports {target}"
        for path, source, target in edges()
        if source == package and LAYER.get(target, len(LAYERS)) >= LAYER[source]
    ]
    assert not upward, upward


def test_the_rule_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tandem.router.app import Router\n")
    assert import_graph.package_of(next(iter(import_graph.imports(bad)))) == "router"
