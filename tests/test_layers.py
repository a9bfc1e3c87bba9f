"""The import rule (design §2), per package: a module imports only packages of lower layers
and its own. Read from the source (every import, also inside functions; not those under
`TYPE_CHECKING`), so a lazy import cannot hide an upward edge."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

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
    {"cli"},
]
LAYER = {package: i for i, layer in enumerate(LAYERS) for package in layer}
# The folders of the `tandem` namespace (tests and bench are not packages of the house).
SOURCES = ["cli", "engine", "kernels", "node", "prefill_node", "decode_node", "router", "sim",
           "operator"]  # fmt: skip


def package_of(module: str) -> str:
    """`tandem.engine.core.scheduler` -> `engine.core`; `tandem.router.app` -> `router`;
    a module at the engine's top (`tandem.engine.llm`) -> `engine`."""
    parts = module.split(".")[1:]
    if parts[0] == "engine" and len(parts) > 1 and (ROOT / "engine" / parts[1]).is_dir():
        return f"engine.{parts[1]}"
    return parts[0]


def module_of(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return "tandem." + ".".join(parts)


def _type_checking_only(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path) -> set[str]:
    """Every `tandem.*` module `path` imports (the module itself for `from x import name`)."""
    found: set[str] = set()
    todo: list[ast.AST] = [ast.parse(path.read_text())]
    while todo:
        node = todo.pop()
        if _type_checking_only(node):
            todo.extend(node.orelse)
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tandem."):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tandem."))
        todo.extend(ast.iter_child_nodes(node))
    return found


def edges() -> list[tuple[str, str, str]]:
    """(file, its package, an imported package) for every import across packages."""
    out = []
    for folder in SOURCES:
        for path in sorted((ROOT / folder).rglob("*.py")):
            source = package_of(module_of(path))
            for target in {package_of(m) for m in imports(path)} - {source}:
                out.append((str(path.relative_to(ROOT)), source, target))
    return out


def test_every_package_has_a_layer():
    packages = {package_of(module_of(p)) for f in SOURCES for p in (ROOT / f).rglob("*.py")}
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
    assert package_of(next(iter(imports(bad)))) == "router"
