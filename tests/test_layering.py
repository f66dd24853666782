"""The package's layering, read from the source (no import runs): the library never imports the
tools (CLI, picture, demo) when it is imported, its imports form no cycle (those inside functions
included: a lazy import hides a circle from the interpreter, not from the design), and
``schedule.py`` is the reference walk alone. Pure Python, no extension needed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = "persistent_gemm"
ROOT = Path(__file__).resolve().parents[1] / "python" / PKG
TOOLS = f"{PKG}.tools"
#: Old paths kept for users (``python -m persistent_gemm``, ``persistent_gemm.demo.main``): they
#: only hand a tool on, so they count as tools.
SHIMS = {f"{PKG}.__main__", f"{PKG}.demo"}
#: The one import from the library into the tools, made only when asked to draw.
LAZY_TOOL_IMPORTS = {(f"{PKG}.explain", f"{PKG}.tools.picture")}


def _modules(root: Path) -> dict[str, Path]:
    """{dotted name: file} of the package in folder ``root``."""
    def name(path: Path) -> str:
        parts = path.relative_to(root.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    return {name(p): p for p in sorted(root.rglob("*.py"))}


MODULES = _modules(ROOT)


def _is_tool(mod: str) -> bool:
    return mod == TOOLS or mod.startswith(TOOLS + ".") or mod in SHIMS


def _imports(mod: str, top_level_only: bool, modules: dict[str, Path] = MODULES) -> set[str]:
    """Package modules that ``mod`` imports; ``top_level_only``: only those its import runs (a
    function's body runs later, a class body or a module-level ``if``/``try`` at once)."""
    path = modules[mod]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    top = mod.partition(".")[0]
    extension_prefix = f"{top}._C"  # the compiled modules (_C, _C_<arch>): leaves, built here or not
    found: set[str] = set()

    def add(name: str) -> None:
        if name.startswith(extension_prefix):
            return
        if name == top or name.startswith(top + "."):
            while name not in modules:  # a name inside a module: the module
                name = name.rpartition(".")[0]
            if name != mod:
                found.add(name)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if top_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                continue  # read by type checkers only
            if isinstance(child, ast.Import):
                for a in child.names:
                    add(a.name)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(up + ([child.module] if child.module else []))
                for a in child.names:
                    sub = f"{base}.{a.name}"
                    add(sub if sub in modules or sub.startswith(extension_prefix) else base)
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return found


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of ``graph`` as a path of modules, or [] when it has none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(n: str) -> list[str]:
        state[n] = 1
        path.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (c := walk(m)):
                return c
        state[n] = 2
        path.pop()
        return []

    for n in sorted(graph):
        if n not in state and (c := walk(n)):
            return c
    return []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per tangle of ``graph`` (a strongly connected component of two or more
    modules), so that one failure names every circle, not the first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    tangles: list[set[str]] = []

    def connect(n: str) -> None:  # Tarjan's algorithm
        index[n] = low[n] = len(index)
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if m not in index:
                connect(m)
                low[n] = min(low[n], low[m])
            elif m in stack:
                low[n] = min(low[n], index[m])
        if low[n] == index[n]:
            tangle = set()
            while n not in tangle:
                tangle.add(stack.pop())
            if len(tangle) > 1:
                tangles.append(tangle)

    for n in sorted(graph):
        if n not in index:
            connect(n)
    return sorted(_cycle({n: graph[n] & t for n in t}) for t in tangles)


LIBRARY = sorted(m for m in MODULES if not _is_tool(m))
TOP = {m: _imports(m, top_level_only=True) for m in MODULES}
ALL = {m: _imports(m, top_level_only=False) for m in MODULES}


def test_the_walk_sees_the_package():
    # Guards the test itself: a resolver that found nothing would pass everything below.
    assert {f"{PKG}.schedule", f"{PKG}.catalogue", f"{PKG}.tools.cli", f"{PKG}.tools.picture"} <= set(MODULES)
    assert f"{PKG}.schedule" in TOP[f"{PKG}.catalogue"]
    assert f"{PKG}.tools.picture_data" in TOP[f"{PKG}.tools.picture_layers"]
    assert f"{PKG}.tools.picture" in _imports(f"{PKG}.explain", top_level_only=False)


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []
    two = {"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert _cycles(two) == [["a", "b", "a"], ["c", "d", "e", "c"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def test_a_circle_through_lazy_imports_is_seen(tmp_path):
    # The shape of nn.py <-> _linear_op.py (to 2026-12): each imports the other inside a function,
    # so importing either works and only the graph of all imports has the circle.
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import nn\n")
    (pkg / "nn.py").write_text("from . import base\n\ndef forward():\n    from ._linear_op import op\n")
    (pkg / "_linear_op.py").write_text("from .base import x\n\ndef op():\n    from .nn import Linear\n")
    (pkg / "base.py").write_text("x = 1\n")
    modules = _modules(pkg)
    top = {m: _imports(m, True, modules) for m in modules}
    every = {m: _imports(m, False, modules) for m in modules}
    assert top["pkg.nn"] == {"pkg.base"} and _cycles(top) == []
    assert _cycles(every) == [["pkg._linear_op", "pkg.nn", "pkg._linear_op"]]


@pytest.mark.parametrize("mod", LIBRARY)
def test_library_never_imports_a_tool_when_imported(mod):
    tools = sorted(m for m in TOP[mod] if _is_tool(m))
    assert not tools, f"{mod} imports {tools} at import time; the tools sit on the library, not under it"


def test_library_imports_tools_only_where_listed():
    lazy = {(m, t) for m in LIBRARY for t in _imports(m, top_level_only=False) if _is_tool(t)}
    assert lazy == LAZY_TOOL_IMPORTS


def test_module_level_imports_have_no_cycle():
    assert _cycle({m: TOP[m] for m in LIBRARY}) == []
    assert _cycle(TOP) == []  # the tools included


def _arrows(cycle: list[str]) -> str:
    return "".join(f" -> {b}" + ("" if b in TOP[a] else " (lazy)") for a, b in zip(cycle, cycle[1:]))


def test_no_import_cycle_even_through_lazy_imports():
    # Every import, those inside functions and the tools included: a circle that closes only when
    # a function runs still ties its modules into one (none can change or be read alone). None is
    # allowed, so there is no list of exceptions.
    circles = [c[0] + _arrows(c) for c in _cycles(ALL)]
    assert not circles, "import cycles:\n" + "\n".join(circles)


def test_library_never_imports_the_package_face():
    # The face (__init__) imports the library; a library module asking it back, even lazily,
    # would point up. Whether the ops exist is persistent_gemm._extension's to say.
    back = sorted(m for m in LIBRARY if m != PKG and PKG in _imports(m, top_level_only=False))
    assert not back, f"{back} import {PKG} itself"


def test_schedule_is_the_reference_alone():
    # The meaning of a schedule: it imports no other module of the package but its stream-K
    # arithmetic, which imports none, not even lazily (the catalogue, the JIT and the picture all
    # build on it).
    assert _imports(f"{PKG}.schedule", top_level_only=False) == {f"{PKG}.stream_k"}
    assert _imports(f"{PKG}.stream_k", top_level_only=False) == set()


def test_shims_hand_on_the_tools():
    import persistent_gemm.demo as demo_shim
    from persistent_gemm import __main__ as main_shim
    from persistent_gemm.tools import cli, demo

    assert demo_shim.main is demo.main and main_shim.main is cli.main
