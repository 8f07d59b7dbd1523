"""Checks the router's module layering from the paths its Rust files name.

Every `use crate::…`, `use super::…`, `self::…`, `crate::x::y` and child-module path in `router/src/**/*.rs` is an
edge from the file that names it to the file that defines the module it reaches. Two rules hold:

- the top-level modules (`http`, `validation`, `scheduler`, …) import each other without a cycle;
- no two files import each other, except a module file and its direct child.

Exits non-zero and lists the violations when a rule is broken; `--report` also prints the largest file-level cycle.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

Module = tuple[str, ...]
TOKEN = re.compile(r"[A-Za-z_]\w*|::|[{}();,*<>]|\S")
CHAR_LITERAL = re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^\\'\n])'")
PATH_ROOTS = frozenset({"crate", "super", "self"})


def strip_rust(source: str) -> str:
    """Blanks out comments, strings and char literals, keeping every newline so line numbers stay."""
    out: list[str] = []
    i, n = 0, len(source)
    while i < n:
        end = _literal_end(source, i)
        if end == i:
            out.append(source[i])
            i += 1
            continue
        out.append(re.sub(r"[^\n]", " ", source[i:end]))
        i = end
    return "".join(out)


def _literal_end(source: str, i: int) -> int:
    """End of the comment or literal starting at `i`, or `i` itself when none starts there."""
    if source.startswith("//", i):
        newline = source.find("\n", i)
        return len(source) if newline < 0 else newline
    if source.startswith("/*", i):
        return _block_comment_end(source, i)
    starts_word = i == 0 or not (source[i - 1].isalnum() or source[i - 1] == "_")
    raw = re.compile(r"b?r(#*)\"").match(source, i) if starts_word else None
    if raw:
        close = source.find('"' + raw.group(1), raw.end())
        return len(source) if close < 0 else close + 1 + len(raw.group(1))
    if source[i] == '"' or (starts_word and source.startswith('b"', i)):
        j = source.index('"', i) + 1
        while j < len(source) and source[j] != '"':
            j += 2 if source[j] == "\\" else 1
        return j + 1
    if source[i] == "'":
        char = CHAR_LITERAL.match(source, i)
        return char.end() if char else i
    return i


def _block_comment_end(source: str, i: int) -> int:
    depth, j = 0, i
    while j < len(source):
        if source.startswith("/*", j):
            depth, j = depth + 1, j + 2
        elif source.startswith("*/", j):
            depth, j = depth - 1, j + 2
            if depth == 0:
                return j
        else:
            j += 1
    return j


def module_of(path: Path, src: Path) -> Module:
    """The module path a file defines: `http/openai/mod.rs` -> ("http", "openai"); `lib.rs` -> ()."""
    parts = path.relative_to(src).with_suffix("").parts
    if parts in {("lib",), ("main",)}:
        return ()
    return parts[:-1] if parts[-1] == "mod" else parts


@dataclass
class Crate:
    """Files of one crate and the module-to-module edges between them."""

    src: Path
    files: dict[Module, Path] = field(default_factory=dict)
    # Inline modules of the crate root (`pb`) are nodes of their own: the root only declares modules.
    root_inline: set[Module] = field(default_factory=set)
    edges: dict[Module, set[Module]] = field(default_factory=dict)

    def node_of(self, target: Module) -> Module:
        """The deepest known module (file or root inline module) that contains `target`."""
        for length in range(len(target), -1, -1):
            prefix = target[:length]
            if prefix in self.files or prefix in self.root_inline:
                return prefix
        return ()

    def label(self, node: Module) -> str:
        if node in self.files:
            return self.files[node].relative_to(self.src).as_posix()
        return "lib.rs::" + "::".join(node)


def load_crate(src: Path) -> Crate:
    crate = Crate(src)
    for path in sorted(src.rglob("*.rs")):
        if path.relative_to(src).as_posix() != "main.rs":
            crate.files[module_of(path, src)] = path
    crate.root_inline = {(name,) for name in _inline_modules(strip_rust((src / "lib.rs").read_text()))}
    for module, path in crate.files.items():
        tokens = [t.group() for t in TOKEN.finditer(strip_rust(path.read_text()))]
        for reached in FileScan(module, tokens).targets():
            node = crate.node_of(reached)
            if node != module:
                crate.edges.setdefault(module, set()).add(node)
    return crate


def _inline_modules(stripped: str) -> list[str]:
    return re.findall(r"\bmod\s+([A-Za-z_]\w*)\s*\{", stripped)


class FileScan:
    """Walks one file's tokens, tracking inline `mod x { … }` scopes, and yields every module path it names."""

    def __init__(self, module: Module, tokens: list[str]) -> None:
        self.module = module
        self.tokens = tokens
        children = {tokens[i + 1] for i, t in enumerate(tokens[:-2]) if t == "mod" and tokens[i + 2] in {";", "{"}}
        self.children = children

    def targets(self) -> Iterator[Module]:
        scopes: list[tuple[Module, int]] = [(self.module, -1)]
        depth, i, tokens = 0, 0, self.tokens
        while i < len(tokens):
            token = tokens[i]
            if token == "mod" and i + 2 < len(tokens) and tokens[i + 2] == "{":
                scopes.append(((*scopes[-1][0], tokens[i + 1]), depth))
                depth, i = depth + 1, i + 3
                continue
            if token == "{":
                depth += 1
            elif token == "}":
                depth -= 1
                if depth == scopes[-1][1]:
                    scopes.pop()
            elif token == "use":
                end = tokens.index(";", i)
                for path in UseTree(tokens[i + 1 : end]).paths():
                    yield from self._resolve(scopes[-1][0], path)
                i = end
            elif self._starts_path(i):
                path, i = self._read_path(i)
                yield from self._resolve(scopes[-1][0], path)
                continue
            i += 1

    def _starts_path(self, i: int) -> bool:
        tokens = self.tokens
        if i + 2 >= len(tokens) or tokens[i + 1] != "::" or not re.match(r"[A-Za-z_]", tokens[i + 2]):
            return False
        if i > 0 and tokens[i - 1] in {"::", "."}:
            return False
        return tokens[i] in PATH_ROOTS or tokens[i] in self.children

    def _read_path(self, i: int) -> tuple[list[str], int]:
        path = [self.tokens[i]]
        i += 1
        while i + 1 < len(self.tokens) and self.tokens[i] == "::" and re.match(r"[A-Za-z_]", self.tokens[i + 1]):
            path.append(self.tokens[i + 1])
            i += 2
        return path, i

    def _resolve(self, scope: Module, path: list[str]) -> Iterator[Module]:
        head, rest = path[0], path[1:]
        if head == "crate":
            base: Module = ()
        elif head in {"super", "self"}:
            base = scope
            while path and path[0] in {"super", "self"}:
                base = base[:-1] if path[0] == "super" else base
                path = path[1:]
            rest = path
        elif head in self.children:
            base, rest = scope, path
        else:
            return
        yield (*base, *(segment for segment in rest if segment != "self"))


class UseTree:
    """Expands the tokens of one `use` item (`crate::a::{b, c::{self, D}}`) into full paths."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def paths(self) -> list[list[str]]:
        return self._tree([])

    def _peek(self) -> str:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else ""

    def _tree(self, prefix: list[str]) -> list[list[str]]:
        segments = list(prefix)
        while True:
            token = self._peek()
            self.pos += 1
            if token == "{":
                found: list[list[str]] = []
                while self._peek() not in {"}", ""}:
                    found += self._tree(segments)
                    if self._peek() == ",":
                        self.pos += 1
                self.pos += 1
                return found
            if token == "*":
                return [segments]
            if token == "::":
                continue
            segments.append(token)
            if self._peek() == "as":
                self.pos += 2
            if self._peek() != "::":
                return [segments]


def top_level(module: Module) -> str:
    return module[0] if module else "crate"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found, key=len, reverse=True)


def violations(crate: Crate) -> list[str]:
    """Every broken layering rule, one line each."""
    found: list[str] = []
    modules: dict[str, set[str]] = {}
    for source, targets in crate.edges.items():
        for target in targets:
            if top_level(source) != top_level(target):
                modules.setdefault(top_level(source), set()).add(top_level(target))
    for component in cycles(modules):
        found.append("top-level modules import each other in a cycle: " + ", ".join(component))
    for source, targets in sorted(crate.edges.items()):
        for target in sorted(targets):
            parent_and_child = source[:-1] == target or target[:-1] == source
            if source < target and source in crate.edges.get(target, set()) and not parent_and_child:
                found.append(f"{crate.label(source)} and {crate.label(target)} import each other")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", type=Path, default=Path(__file__).resolve().parents[1] / "router" / "src")
    parser.add_argument("--report", action="store_true", help="also print the largest file-level import cycle")
    args = parser.parse_args(argv)
    crate = load_crate(args.src)
    if args.report:
        graph = {crate.label(s): {crate.label(t) for t in targets} for s, targets in crate.edges.items()}
        largest = (cycles(graph) or [[]])[0]
        print(f"largest file-level import cycle: {len(largest)} files")
        for name in largest:
            print(f"  {name}")
    broken = violations(crate)
    for line in broken:
        print(line, file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
