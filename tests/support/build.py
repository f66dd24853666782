"""What the (possibly narrowed) build holds: built configs, their output dtypes and accumulation."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from typing import Optional

import pytest
import torch

import persistent_gemm as pg
from persistent_gemm.catalogue import parse_name

from .common import OUT_DTYPES

# -- what the build holds -------------------------------------------------------------------------
def family_of(name: str) -> str:
    """The dtype family of a canonical config name: ``sm90a_e4m3_...`` -> ``e4m3``."""
    return parse_name(name).dtype


def is_fast_accum(entry: dict) -> bool:
    return bool(entry["fast_accum"]) if "fast_accum" in entry else parse_name(entry["config"]).accum == "fast"


def _built_entries() -> list[dict]:
    if not pg.extension_available():
        return []
    return list(pg._C.built_kernels())


def built_configs(family: str, fast_accum: Optional[bool] = None, arch: Optional[str] = None) -> list[str]:
    """Sorted canonical names of the built configs of a dtype family (bf16, fp16, e4m3, mxfp8,
    e4m3xe2m1), optionally only fast- or promoted-accumulation ones, optionally one arch.
    ``[]`` when nothing matches or the extension is missing, so it is safe in parametrize
    (an empty parameter set is reported as one skipped test)."""
    names = set()
    for e in _built_entries():
        name = e["config"]
        cfg = parse_name(name)
        if cfg.dtype != family or (arch is not None and cfg.arch != arch):
            continue
        if fast_accum is not None and is_fast_accum(e) != fast_accum:
            continue
        names.add(name)
    return sorted(names)


_REG_DTYPES = {0: torch.bfloat16, 1: torch.float16, 2: torch.float32}  # registry.h's DType


def config_out_dtypes(name: str) -> tuple:
    """Output dtypes a forced config serves: those its variants write, and every one if it has
    an fp32 variant (the dispatcher casts fp32 down once). Shape-tuned configs carry only the
    common fast path, so forcing them with another out dtype is a clear error, not a test."""
    written = {_REG_DTYPES.get(e["d_dtype"]) for e in _built_entries() if e["config"] == name}
    return OUT_DTYPES if torch.float32 in written else tuple(d for d in OUT_DTYPES if d in written)


def config_is_fast_accum(name: str) -> bool:
    """Whether a built config accumulates FP8 the fast way (else by its name's token)."""
    for e in _built_entries():
        if e["config"] == name:
            return is_fast_accum(e)
    return parse_name(name).accum == "fast"


def requires_config(name: str) -> None:
    """Skip the calling test unless ``name`` is built (PGEMM_KERNELS narrows the build)."""
    if name not in {e["config"] for e in _built_entries()}:
        pytest.skip(f"config {name} is not built in this build")


def catalogue_config(name: str):
    return next(c for c in pg.CATALOGUE if c.name == name)


# -- tools -------------------------------------------------------------------------------------------
def cuobjdump() -> str:
    """cuobjdump from the CUDA toolkit, else the one the triton package (which torch installs)
    ships; skips the test when neither is there."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("triton")
    if spec and spec.submodule_search_locations:
        cand = Path(spec.submodule_search_locations[0]) / "backends" / "nvidia" / "bin" / "cuobjdump"
        if cand.is_file():
            return str(cand)
    pytest.skip("no cuobjdump (CUDA toolkit or triton) on this machine")
