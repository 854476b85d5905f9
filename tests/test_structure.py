"""The code's shape, from its AST: modules, classes and functions under their sizes, no import cycle, and the
README's layout naming the packages there are.

Sizes (lines from the first to the last of the node, docstring included): a module under 400, a class under
250, a function or method under 60. An import cycle counts every import, one inside a function too: a lazy
import that closes a cycle is still a cycle.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sweep", "trainer", "clusters")
MAX_MODULE, MAX_CLASS, MAX_FUNCTION = 400, 250, 60


@dataclass(frozen=True)
class Module:
    name: str
    """Dotted module name; a package's __init__ is the package's own name."""
    path: Path
    """The file, under ROOT."""
    is_package: bool
    """An __init__.py: relative imports resolve against the package itself."""


@cache
def modules() -> dict[str, Module]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found[name] = Module(name, path, is_package)
    return found


@cache
def tree(name: str) -> ast.Module:
    module = modules()[name]
    return ast.parse(module.path.read_text(), filename=str(module.path))


def _where(name: str, node: ast.AST) -> str:
    return f"{modules()[name].path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}"


def _span(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def oversized(kinds: tuple[type, ...], limit: int) -> list[str]:
    """`path:line name (n lines)` of each node of `kinds`, anywhere in a module, longer than `limit`."""
    return [
        f"{_where(name, node)} {node.name} ({_span(node)} lines)"
        for name in modules()
        for node in ast.walk(tree(name))
        if isinstance(node, kinds) and _span(node) > limit
    ]


def test_no_module_is_over_400_lines():
    over = [
        f"{m.path.relative_to(ROOT)} ({n} lines)"
        for m in modules().values()
        if (n := len(m.path.read_text().splitlines())) > MAX_MODULE
    ]
    assert over == [], f"modules over {MAX_MODULE} lines: {over}"


def test_no_class_is_over_250_lines():
    over = oversized((ast.ClassDef,), MAX_CLASS)
    assert over == [], f"classes over {MAX_CLASS} lines: {over}"


def test_no_function_is_over_60_lines():
    over = oversized((ast.FunctionDef, ast.AsyncFunctionDef), MAX_FUNCTION)
    assert over == [], f"functions over {MAX_FUNCTION} lines: {over}"


# -- imports -----------------------------------------------------------------------------------------------


def _base(name: str, node: ast.ImportFrom) -> str:
    """The module an ImportFrom names, its dots resolved against `name`'s package."""
    if not node.level:
        return node.module or ""
    package = name if modules()[name].is_package else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _known(dotted: str) -> str | None:
    """The project module `dotted` is, or the project module holding it (`a.b.attr` -> `a.b`), else None."""
    while dotted and dotted not in modules():
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imports(name: str) -> set[str]:
    """The project modules `name` imports, at its top or inside a function: `from pkg import module` is the
    module, `from module import name` the module."""
    found = set()
    for node in ast.walk(tree(name)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _base(name, node)
            targets = [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"] or [base]
        else:
            continue
        found.update(t for t in map(_known, targets) if t is not None and t != name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_import_graph_resolves_relative_and_from_package_imports():
    assert "sweep.record.store" in imports("sweep.results.query")  # from sweep.record import store
    assert {"sweep.spec.grid", "sweep.execution.scheduler"} <= imports("sweep.execution.runner")
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e", "f"]]


def test_no_import_cycle_even_through_an_import_inside_a_function():
    graph = {name: imports(name) for name in modules()}
    found = cycles(graph)
    named = [
        " <-> ".join(c) + ": " + "; ".join(f"{a} imports {', '.join(sorted(graph[a] & set(c)))}" for a in c)
        for c in found
    ]
    assert found == [], f"import cycles: {named}"


# -- the README's layout -----------------------------------------------------------------------------------

NAME = re.compile(r"(?<![\w/.-])([A-Za-z_][\w*]*(?:/[\w*]+)*(?:/|\.py|\.yaml))")


def _outside_parentheses(text: str) -> str:
    while True:
        text, n = re.subn(r"\([^()]*\)", " ", text)
        if not n:
            return text


def layout_names(readme: str) -> dict[str, set[str]]:
    """Per top-level folder of the README's layout block (`sweep/`, ...): the names its entry gives outside
    parentheses (a parenthesis says what a name is), relative to that folder."""
    block = re.search(r"^## Layout\n+```\n(.*?)```", readme, re.S | re.M)
    assert block, "README.md has no `## Layout` code block"
    entries: dict[str, str] = {}
    top = None
    for line in block.group(1).splitlines():
        if line and not line[0].isspace():
            top, _, line = line.partition(" ")
            entries[top] = ""
        if top is not None:
            entries[top] += " " + line
    return {top: set(NAME.findall(_outside_parentheses(text))) for top, text in entries.items()}


def test_the_layout_reader_takes_the_names_outside_parentheses():
    text = (
        "## Layout\n\n```\nsweep/      commands/ (the CLI), spec/ (grid.py: pure),\n            errors.py\n"
        "docs/       guides (Transformer Engine/ROCm)\n```\n"
    )
    assert layout_names(text) == {"sweep/": {"commands/", "spec/", "errors.py"}, "docs/": set()}


def _exists(folder: Path, name: str) -> bool:
    return any(folder.glob(name.rstrip("/"))) and (
        not name.endswith("/") or all(p.is_dir() for p in folder.glob(name.rstrip("/")))
    )


def test_the_readmes_layout_names_every_package_and_only_what_exists():
    names = layout_names((ROOT / "README.md").read_text())
    assert {f"{p}/" for p in PACKAGES} <= set(names), sorted(names)
    missing = [f"{top}{n}" for top, found in names.items() for n in sorted(found) if not _exists(ROOT / top, n)]
    assert missing == [], f"the README's layout names what is not there: {missing}"
    packages = [m.name.replace(".", "/") for m in modules().values() if m.is_package and "." in m.name]
    unnamed = [p for p in sorted(packages) if p.partition("/")[2] + "/" not in names[p.partition("/")[0] + "/"]]
    assert unnamed == [], f"packages the README's layout does not name: {unnamed}"


@pytest.mark.parametrize(
    "doc", [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))], ids=lambda p: str(p.relative_to(ROOT))
)
def test_every_source_path_the_docs_name_exists(doc):
    paths = set(re.findall(r"`((?:sweep|trainer|clusters)/[\w/.]*)`", doc.read_text()))
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert missing == [], f"{doc.name} names paths that are not there: {missing}"
