"""Host programs compiled by nvcc for the CPU suite (tests/host/*.cu, tests/device probes, generated
probes): the toolkit, CUTLASS and include folders come from persistent_gemm.build_flags, the
lookup setup.py and the JIT use, so a test compiles against the headers the build does."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import pytest

from persistent_gemm import build_flags, codegen

ROOT = Path(__file__).resolve().parents[2]
#: Enough for host code (CuTe's constexpr layouts); a caller compiling device code adds its
#: -gencode, or passes build_flags.nvcc_flags(...) for the build's own flags.
HOST_FLAGS: tuple[str, ...] = ("-std=c++17", "--expt-relaxed-constexpr")


def toolchain() -> tuple[str, list[str]]:
    """(nvcc, its -I flags); skips the calling test when the toolkit or CUTLASS is missing."""
    home = build_flags.find_cuda_home()
    if home is None:
        pytest.skip("no CUDA toolkit (nvcc)")
    cutlass, why = build_flags.find_cutlass()
    if cutlass is None:
        pytest.skip(why)
    codegen.write_arch_limits()  # the builders' generated header (setup.py writes it too)
    return str(home / "bin" / "nvcc"), [f"-I{d}" for d in build_flags.include_dirs(ROOT, cutlass, home)]


def build_host_program(sources: Sequence, exe, flags: Sequence[str] = HOST_FLAGS, timeout: float = 900) -> str:
    """nvcc ``sources`` into ``exe``; the test fails with nvcc's stderr if it does not build.
    Several sources compile in parallel, one nvcc per core (one nvcc call takes its files one
    after another, and pytest leaves the other cores idle), then link."""
    nvcc, includes = toolchain()
    sources = [str(s) for s in sources]
    if len(sources) == 1:
        steps = [[nvcc, *flags, *includes, sources[0], "-o", str(exe)]]
    else:
        objects = [f"{exe}.{i}.o" for i in range(len(sources))]
        steps = [[nvcc, *flags, *includes, "-c", src, "-o", obj] for src, obj in zip(sources, objects)]
    with ThreadPoolExecutor(max_workers=max(1, min(len(steps), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), steps))
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    if len(sources) > 1:
        link = subprocess.run([nvcc, *flags, *objects, "-o", str(exe)], capture_output=True, text=True, timeout=timeout)
        assert link.returncode == 0, link.stderr[-4000:]
    return str(exe)
