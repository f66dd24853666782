"""persistent_gemm: persistent warp-specialized GEMMs for Hopper (SM90) and Blackwell (SM100),
driven by a user-visible tile scheduler.

Ops (``torch.ops.persistent_gemm.*``, typed wrappers here): :func:`mm`, :func:`scaled_mm`,
:func:`mxfp8_mm`, :func:`fp8_fp4_mm`. Scheduling: :class:`TileSchedule`, :class:`KernelConfig`,
:data:`CATALOGUE`; any valid config runs (``config=``; compiled at first use and cached,
:func:`precompile`), :func:`tune` times candidates and keeps the fastest, :func:`explain` says
what runs and why (and draws it). MX helpers: :func:`quantize_mxfp8`, :func:`quantize_mxfp4` and their
``dequantize_*`` inverses, :func:`prepare_weight` (a weight relaid out once for the kernels).
Models: :mod:`persistent_gemm.nn` (``Linear`` layers in bf16, FP8 rowwise, MXFP8 or FP8xFP4, and
``quantize_(model, format)`` to swap them in).

The scheduler, catalogue and quantization modules are pure Python and import without the
compiled extension; the ops need it (``scripts/setup_and_demo.sh`` builds it).
"""

from __future__ import annotations

from ._version import __version__
from .archs import ARCH_NAMES, ARCHS
from .catalogue import CATALOGUE, ConfigError, KernelConfig
from .explain import Decision, explain
from .jit import JitCompileError, KernelNotBuiltError, precompile
from .prepare import PreparedWeight, from_mxfp4_blocks, prepare_weight
from .quant import dequantize_mxfp4, dequantize_mxfp8, quantize_mxfp4, quantize_mxfp8
from .scale_layout import SCALE_LAYOUTS, from_blocked, to_blocked
from .schedule import ScheduleGrid, TileSchedule
from .tuning import TuneResult, clear_tuning, load_tuning, tune

# Loads _C and registers the arch modules; everything else here builds on it.
from ._extension import (_C, _IMPORT_ERROR, _why_not_built, built_archs, built_configs,  # noqa: F401
                         extension_available, require_extension)

ARCH_MODULES = ARCH_NAMES  # one extension module _C_<arch> per archs.ARCHS entry

if _C is not None:
    from . import selfcheck as _selfcheck  # noqa: E402

    _selfcheck.install()  # the first-use self-check of unvalidated archs runs in a child process
    from . import _ops  # noqa: E402  fake kernels + autograd (needs the schemas)
    from . import _linear_op  # noqa: E402,F401  quantized_linear's fake and CPU kernels
    from ._ops import addmm, fp8_fp4_mm, mm, mxfp8_mm, scaled_mm  # noqa: E402,F401
    from .grouped import grouped_mm, masked_grouped_mm  # noqa: E402,F401  MoE experts (csrc/grouped.cpp)
    from .moe_routing import moe_activation, moe_combine, moe_dispatch  # noqa: E402,F401  (csrc/moe_routing.cpp)
    from . import nn  # noqa: E402,F401  Linear layers and quantize_ (need the ops)


def build_info() -> dict:
    """What this installation is: package, torch and CUDA versions, the CUTLASS wheel, the
    registered arch modules with their kernel counts, the kernel-table ABI, and whether the
    extension loaded (with the import error when it did not)."""
    import torch

    try:
        from importlib.metadata import version

        cutlass = version("nvidia-cutlass")
    except Exception:  # a CUTLASS checkout, or none (the pure-Python tools)
        cutlass = None
    info = {
        "version": __version__,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cutlass": cutlass,
        "extension": _C is not None,
        "archs": {},
        "registry_abi": None,
        "import_error": None if _IMPORT_ERROR is None else _why_not_built(),
    }
    if _C is not None:
        info["registry_abi"] = int(_C.REGISTRY_ABI)
        for e in _C.built_kernels():
            info["archs"].setdefault(e["arch"], set()).add(e["config"])
        info["archs"] = {a: len(c) for a, c in sorted(info["archs"].items())}
    return info


def _load_tuning_cache() -> None:
    """Winners of earlier tune() runs (the tuning cache) go to the dispatcher at import; nothing
    is compiled here. PGEMM_TUNING=0 skips it."""
    import os
    import warnings

    if _C is None or os.environ.get("PGEMM_TUNING", "1") == "0":
        return
    try:
        load_tuning()
    except Exception as err:  # a broken cache must not break the import
        warnings.warn(f"persistent_gemm: tuning cache not loaded: {err}", stacklevel=3)


_load_tuning_cache()


def __getattr__(name: str):
    if name in ("mm", "addmm", "scaled_mm", "mxfp8_mm", "fp8_fp4_mm", "nn"):
        require_extension()
    raise AttributeError(f"module 'persistent_gemm' has no attribute {name!r}")


__all__ = [
    "__version__",
    "CATALOGUE",
    "ConfigError",
    "KernelConfig",
    "ScheduleGrid",
    "TileSchedule",
    "mm",
    "addmm",
    "scaled_mm",
    "mxfp8_mm",
    "fp8_fp4_mm",
    "quantize_mxfp8",
    "quantize_mxfp4",
    "dequantize_mxfp8",
    "dequantize_mxfp4",
    "SCALE_LAYOUTS",
    "to_blocked",
    "PreparedWeight",
    "prepare_weight",
    "from_mxfp4_blocks",
    "from_blocked",
    "explain",
    "Decision",
    "precompile",
    "KernelNotBuiltError",
    "JitCompileError",
    "tune",
    "TuneResult",
    "built_configs",
    "build_info",
    "load_tuning",
    "clear_tuning",
    "extension_available",
    "built_archs",
]
