"""How persistent_gemm's C++/CUDA is compiled: one source for ``setup.py``, the JIT
(:mod:`persistent_gemm.jit`) and the benchmarks' stock-CUTLASS peer.

Importable without torch (``setup.py`` loads it before torch's build machinery).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

#: Host C++ (torch >= 2.10 headers need C++20).
CXX_FLAGS: tuple[str, ...] = ("-O3", "-std=c++20", "-Wno-deprecated-declarations")
#: nvcc, for every arch; the arch's own ``-gencode`` comes from archs.ARCHS.
NVCC_FLAGS: tuple[str, ...] = (
    "-O3", "-std=c++17", "--expt-relaxed-constexpr", "--expt-extended-lambda", "-DNDEBUG",
    "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
    "-U__CUDA_NO_HALF2_OPERATORS__", "-Xptxas=--warn-on-spills", "-diag-suppress=20012",
)
#: Defined at the top of a generated TU whose tile needs an MMA N extent outside the arch's
#: ``plain_mma_n`` (archs.py; codegen decides), never globally: it slows every TU's compile.
EXTENDED_MMA_SHAPES_MACRO = "CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED"

#: Kernels per generated translation unit (codegen: a config's variants share one TU, which
#: shares CUTLASS's front-end work among them). Bounded by memory: an FP8 config's four variants
#: and walk peak at 4.1 GB in one TU on the CI machine, and two compile jobs must fit its 24 GB.
MAX_KERNELS_PER_TU = 6


def nvcc_flags(gencode: str) -> list[str]:
    return [*NVCC_FLAGS[:2], gencode, *NVCC_FLAGS[2:]]


def find_cuda_home() -> Optional[Path]:
    """CUDA_HOME / CUDA_PATH, else /usr/local/cuda, else the toolkit above the real ``nvcc``
    (not the folder above a wrapper script in /usr/local/bin)."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    candidates = [Path("/usr/local/cuda")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(Path(os.path.realpath(nvcc)).parent.parent)
    for c in candidates:
        if (c / "bin" / "nvcc").is_file() and (c / "include" / "cuda_runtime_api.h").is_file():
            return c
    return None


def nvcc_version(home: Path) -> Optional[tuple[int, int]]:
    try:
        out = subprocess.run([str(home / "bin" / "nvcc"), "--version"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_cutlass() -> tuple[Optional[Path], str]:
    """(CUTLASS root holding include/cutlass, or None; a sentence saying where it was looked for).
    PGEMM_CUTLASS_PATH / CUTLASS_PATH, else the nvidia-cutlass wheel's cutlass_library/source."""
    for var in ("PGEMM_CUTLASS_PATH", "CUTLASS_PATH"):
        if os.environ.get(var):
            root = Path(os.environ[var])
            ok = (root / "include" / "cutlass" / "cutlass.h").is_file()
            return (root if ok else None), f"{var}={root} has no include/cutlass/cutlass.h"
    for entry in sys.path:
        root = Path(entry or ".") / "cutlass_library" / "source"
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            return root, ""
    return None, ("CUTLASS headers not found. Install them with `pip install --no-deps nvidia-cutlass==4.2.0.0`, "
                  "or set PGEMM_CUTLASS_PATH to a CUTLASS checkout (the folder holding include/cutlass)")


def include_dirs(root: Path, cutlass: Path, cuda_home: Path) -> list[str]:
    dirs = [root / "include", root / "csrc", cutlass / "include", cutlass / "tools" / "util" / "include",
            cuda_home / "include"]
    cccl = cuda_home / "include" / "cccl"  # CUDA 13 moved libcu++ here; g++ needs it for CUTLASS
    if cccl.is_dir():
        dirs.append(cccl)
    return [str(d) for d in dirs]


def torch_cpp_extension(home: Path):
    """``torch.utils.cpp_extension``, pointed at the toolkit ``home``. torch fixes its CUDA_HOME
    when that module is first imported, from the folder above the first ``nvcc`` on PATH, which
    is wrong when that nvcc is a wrapper script (/usr/local/bin/nvcc). Imports torch: call it
    only where torch is wanted (the JIT, the benchmarks), never from setup.py."""
    import torch.utils.cpp_extension as cpp

    if cpp.CUDA_HOME is None or not (Path(cpp.CUDA_HOME) / "include" / "cuda_runtime_api.h").is_file():
        cpp.CUDA_HOME = str(home)
    return cpp
