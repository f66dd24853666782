"""The package's layering, read from the source (no import runs): the library never imports the
tools (CLI, picture, demo) when it is imported, its module-level imports form no cycle, and
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


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(ROOT.rglob("*.py"))}
#: The compiled modules (_C, _C_<arch>): leaves, whether built here or not.
EXTENSION_PREFIX = f"{PKG}._C"


def _is_tool(mod: str) -> bool:
    return mod == TOOLS or mod.startswith(TOOLS + ".") or mod in SHIMS


def _imports(mod: str, top_level_only: bool) -> set[str]:
    """Package modules that ``mod`` imports; ``top_level_only``: only those its import runs (a
    function's body runs later, a class body or a module-level ``if``/``try`` at once)."""
    path = MODULES[mod]
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()

    def add(name: str) -> None:
        if name.startswith(EXTENSION_PREFIX):
            return
        if name == PKG or name.startswith(PKG + "."):
            while name not in MODULES:  # a name inside a module: the module
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
                    add(sub if sub in MODULES or sub.startswith(EXTENSION_PREFIX) else base)
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


LIBRARY = sorted(m for m in MODULES if not _is_tool(m))
TOP = {m: _imports(m, top_level_only=True) for m in MODULES}


def test_the_walk_sees_the_package():
    # Guards the test itself: a resolver that found nothing would pass everything below.
    assert {f"{PKG}.schedule", f"{PKG}.catalogue", f"{PKG}.tools.cli", f"{PKG}.tools.picture"} <= set(MODULES)
    assert f"{PKG}.schedule" in TOP[f"{PKG}.catalogue"]
    assert f"{PKG}.tools.picture_data" in TOP[f"{PKG}.tools.picture_layers"]
    assert f"{PKG}.tools.picture" in _imports(f"{PKG}.explain", top_level_only=False)


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


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
