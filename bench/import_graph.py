"""The house's import graph, read from the source through the folder -> `tandem.<folder>`
map that import-reading tools cannot follow (docs/architecture.md, "Packages and layers").

Every `tandem.*` import of every module counts, also one inside a function; one under
`if TYPE_CHECKING:` does not. A package is a top-level folder (`router`) or, under
`engine/`, a subpackage (`engine.core`); modules at `engine/`'s top are `engine`. Prints
the package graph in Graphviz `dot` (`| dot -Tsvg > house.svg`), each edge with the number
of files that import along it. `tests/test_layers.py` checks the same edges against the
layers.

    python -P bench/import_graph.py [--root DIR]
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The folders of the `tandem` namespace (tests and bench are not packages of the house).
SOURCES = ("cli", "engine", "kernels", "node", "prefill_node", "decode_node", "router", "sim",
           "operator", "planner")  # fmt: skip


def package_of(module: str, root: Path = ROOT) -> str:
    """`tandem.engine.core.scheduler` -> `engine.core`; `tandem.router.app` -> `router`;
    a module at the engine's top (`tandem.engine.llm`) -> `engine`."""
    parts = module.split(".")[1:]
    if parts[0] == "engine" and len(parts) > 1 and (root / "engine" / parts[1]).is_dir():
        return f"engine.{parts[1]}"
    return parts[0]


def module_of(path: Path, root: Path = ROOT) -> str:
    """The import name of the file at `path`: `engine/core/__init__.py` -> `tandem.engine.core`."""
    parts = [p for p in path.relative_to(root).with_suffix("").parts if p != "__init__"]
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


def edges(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(file, its package, an imported package) for every import across packages."""
    out = []
    for folder in SOURCES:
        for path in sorted((root / folder).rglob("*.py")):
            source = package_of(module_of(path, root), root)
            for target in {package_of(m, root) for m in imports(path)} - {source}:
                out.append((str(path.relative_to(root)), source, target))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args()
    counts = Counter((source, target) for _, source, target in edges(args.root))
    print("digraph tandem {\n  rankdir=BT;\n  node [shape=box];")
    for (source, target), n in sorted(counts.items()):
        print(f'  "{source}" -> "{target}" [label={n}];')
    print("}")


if __name__ == "__main__":
    main()
