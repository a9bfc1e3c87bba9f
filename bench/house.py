"""The house in numbers: how big the project's files, functions and folders are, the figures
issue 39's reshape is measured by (before and after).

Python files under the project's packages (`PACKAGES`; `tests/` too with `--tests`; never
`.venv`). Lines are physical lines; a function's lines run from its `def` to its last line
(its decorators not counted), methods and nested functions each on their own. Prints the
largest `--top` files and functions, every folder's files and lines, and the count of
`# fmt: skip` markers (in those files, and in the whole checkout). Nothing is timed.

    python -P bench/house.py [--root DIR] [--tests] [--top 15]

`--root DIR` measures another checkout (the tree before a change).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

PACKAGES = (
    "cli", "engine", "node", "router", "operator", "prefill_node", "decode_node", "kernels", "sim"
)  # fmt: skip
SKIPPED = frozenset({".venv", "__pycache__"})
FMT_SKIP = "# fmt: skip"


@dataclass(frozen=True)
class Span:
    """A file or a function and how many lines it has."""

    name: str
    num_lines: int


def python_files(root: Path, packages: tuple[str, ...]) -> list[Path]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            if not SKIPPED & set(path.relative_to(root).parts):
                found.append(path)
    return found


def count_fmt_skip(text: str) -> int:
    return sum(line.rstrip().endswith(FMT_SKIP) for line in text.splitlines())


def function_spans(tree: ast.Module, where: str) -> list[Span]:
    """Every function and method in `tree`, named `<where>:<Class>.<name>`."""
    spans = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                spans.append(Span(f"{where}:{name}", child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def table(header: tuple[str, ...], rows: list[tuple]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print()


def largest(spans: list[Span], top: int) -> list[tuple[str, int]]:
    ranked = sorted(spans, key=lambda s: (-s.num_lines, s.name))[:top]
    return [(f"`{s.name}`", s.num_lines) for s in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--tests", action="store_true", help="count tests/ too")
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    print(f"command: python -P {' '.join(sys.argv)}")
    print(f"date: {datetime.date.today().isoformat()}")
    packages = PACKAGES + (("tests",) if args.tests else ())
    print(f"packages: {', '.join(packages)} (Python files; .venv skipped)\n")

    files, functions = [], []
    folder_files: Counter[str] = Counter()
    folder_lines: Counter[str] = Counter()
    num_fmt_skip = 0
    for path in python_files(args.root, packages):
        text = path.read_text()
        where = str(path.relative_to(args.root))
        num_lines = len(text.splitlines())
        files.append(Span(where, num_lines))
        functions += function_spans(ast.parse(text), where)
        folder = str(path.parent.relative_to(args.root))
        folder_files[folder] += 1
        folder_lines[folder] += num_lines
        num_fmt_skip += count_fmt_skip(text)

    total = sum(f.num_lines for f in files)
    print(f"files: {len(files)}, lines: {total}, functions: {len(functions)}\n")
    print(f"Largest {args.top} files:\n")
    table(("file", "lines"), largest(files, args.top))
    print(f"Largest {args.top} functions:\n")
    table(("function", "lines"), largest(functions, args.top))
    over = sum(f.num_lines > 300 for f in files), sum(f.num_lines > 25 for f in functions)
    print(f"files over 300 lines: {over[0]}; functions over 25 lines: {over[1]}\n")
    print("Files per folder:\n")
    table(
        ("folder", "files", "lines"),
        [(f"`{name}/`", folder_files[name], folder_lines[name]) for name in sorted(folder_files)],
    )
    everywhere = [p for p in sorted(args.root.rglob("*.py")) if not SKIPPED & set(p.parts)]
    num_everywhere = sum(count_fmt_skip(p.read_text()) for p in everywhere)
    print(f"`{FMT_SKIP}` markers: {num_fmt_skip} in these files, {num_everywhere} in every")
    print("Python file of the checkout (tests and bench included)")


if __name__ == "__main__":
    main()
