"""The compiled extension, loaded once: ``_C`` (the ops' schemas, CPU references and CUDA
dispatch) with every built arch module's kernel table registered in it, or None in a Python-only
install or an unbuilt checkout. Library modules ask here, not the package's face, whether the ops
exist; the package re-exports all of it.
"""

from __future__ import annotations

import importlib

from .archs import ARCH_NAMES

try:
    from . import _C  # noqa: F401  (registers the schemas, CPU references and CUDA dispatch)
except ImportError as _e:  # pragma: no cover - exercised only in an unbuilt checkout
    _C = None
    _IMPORT_ERROR = _e
else:
    _IMPORT_ERROR = None
    # Each arch module hands its kernel table to _C; a missing one just means "not built".
    for _arch in ARCH_NAMES:
        try:
            _mod = importlib.import_module(f"{__package__}._C_{_arch}")
        except ImportError:
            continue
        _C.register_arch(_mod.arch_export())


def extension_available() -> bool:
    """True when the compiled extension loaded (the ops exist)."""
    return _C is not None


def require_extension():
    """The compiled ``_C`` module, or an ImportError saying how to build it."""
    if _C is None:
        raise ImportError(
            "persistent_gemm's compiled extension is not built: run "
            "`scripts/setup_and_demo.sh` (or `scripts/setup_and_test.sh`) in the repository "
            f"({_why_not_built()})"
        )
    return _C


def _why_not_built() -> str:
    """No extension file at all (a Python-only install, an unbuilt checkout) says so; a file that
    failed to load gives the loader's error (a missing symbol, a torch mismatch)."""
    import pathlib

    here = pathlib.Path(__file__).parent
    if not any(here.glob("_C.*.so")) and not any(here.glob("_C.*.pyd")):
        return f"no _C extension file in {here}: a Python-only install, or a checkout not built yet"
    return f"import error: {_IMPORT_ERROR}"


def built_archs() -> list[str]:
    """Arch modules whose kernels were built and registered, e.g. ``["sm90a", "sm100a"]``."""
    return list(require_extension().registered_arches())


def built_configs(arch: str | None = None) -> list[str]:
    """Sorted names of the configs this process can run without compiling: the built ones and
    any JIT-compiled ones loaded so far; ``arch`` (e.g. ``"sm90a"``) narrows to one arch.
    Empty when the extension is not built."""
    if _C is None:
        return []
    return sorted({e["config"] for e in _C.built_kernels() if arch is None or e["arch"] == arch})
