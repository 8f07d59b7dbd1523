"""Lists files over 400 lines and functions over 80 lines in the router (Rust) and the Python packages.

A report, not a gate: clippy (`too_many_lines`) and ruff (`PLR0915`) enforce their own measures. Here a Rust function
counts its non-blank lines outside comments from `fn` to its closing brace; a Python function counts every line from
`def` to its last statement.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

from check_layers import strip_rust

ROOT = Path(__file__).resolve().parents[1]
RUST_DIRS = ("router/src",)
PYTHON_DIRS = ("server", "launcher", "benchmark")
SKIPPED_PARTS = frozenset({"generated", "__pycache__", ".venv"})
FILE_LIMIT = 400
FUNCTION_LIMIT = 80


def rust_functions(source: str) -> Iterator[tuple[str, int, int]]:
    """(name, first line, code lines) of every Rust function with a body."""
    stripped = strip_rust(source)
    for match in re.finditer(r"\bfn\s+([A-Za-z_]\w*)", stripped):
        body = re.compile(r"[{;]").search(stripped, match.end())
        if body is None or body.group() == ";":
            continue
        depth, end = 0, body.start()
        for end in range(body.start(), len(stripped)):
            depth += {"{": 1, "}": -1}.get(stripped[end], 0)
            if depth == 0:
                break
        first = stripped.count("\n", 0, match.start())
        lines = stripped[match.start() : end + 1].splitlines()
        yield match.group(1), first + 1, sum(1 for line in lines if line.strip())


def python_functions(source: str) -> Iterator[tuple[str, int, int]]:
    """(name, first line, lines) of every Python function."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node.name, node.lineno, (node.end_lineno or node.lineno) - node.lineno + 1


def files(dirs: tuple[str, ...], suffix: str) -> list[Path]:
    found = (path for d in dirs for path in (ROOT / d).rglob(f"*{suffix}"))
    return sorted(path for path in found if not SKIPPED_PARTS & set(path.relative_to(ROOT).parts))


Functions = Callable[[str], Iterator[tuple[str, int, int]]]


def report(language: str, paths: list[Path], functions: Functions) -> None:
    long_files = [(path, len(path.read_text().splitlines())) for path in paths]
    long_files = [(path, count) for path, count in long_files if count > FILE_LIMIT]
    long_functions = [
        (path, name, line, count)
        for path in paths
        for name, line, count in functions(path.read_text())
        if count > FUNCTION_LIMIT
    ]
    print(f"{language}: {len(long_files)} files over {FILE_LIMIT} lines, ", end="")
    print(f"{len(long_functions)} functions over {FUNCTION_LIMIT} lines")
    for path, count in long_files:
        print(f"  {path.relative_to(ROOT)}: {count} lines")
    for path, name, line, count in long_functions:
        print(f"  {path.relative_to(ROOT)}:{line} {name}: {count} lines")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    report("Rust (router/src)", files(RUST_DIRS, ".rs"), rust_functions)
    report("Python (server, launcher, benchmark)", files(PYTHON_DIRS, ".py"), python_functions)


if __name__ == "__main__":
    main()
