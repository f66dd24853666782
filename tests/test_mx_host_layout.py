"""The SM90 MX mainloop indexes its accumulator fragment, its register A fragment and the 64 B
swizzled packed-e2m1 tile by hand (collective/sm90_mx_block_scaled_mma.hpp). Those formulas are
checked here against CuTe's own layouts, on the host: tests/host/mx_fragment_layout.cu is
compiled by nvcc (host code only, no GPU) and run."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from persistent_gemm import codegen

ROOT = Path(__file__).resolve().parents[1]


def _cutlass() -> Path:
    for var in ("PGEMM_CUTLASS_PATH", "CUTLASS_PATH"):
        if os.environ.get(var):
            return Path(os.environ[var])
    for entry in sys.path:
        root = Path(entry or ".") / "cutlass_library" / "source"
        if (root / "include" / "cutlass" / "cutlass.h").is_file():
            return root
    pytest.skip("CUTLASS headers not found")


def _nvcc() -> str:
    for c in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if c and (Path(c) / "bin" / "nvcc").is_file():
            return str(Path(c) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if not found:
        pytest.skip("no nvcc")
    return found


def build_host_program(sources, exe, flags=("-std=c++17", "--expt-relaxed-constexpr"), timeout=900) -> str:
    """nvcc ``sources`` (host programs: tests/host/*.cu, generated probes) into ``exe`` with the
    project's, CUTLASS's and CCCL's headers; the test fails with nvcc's stderr if it does not build.
    Several sources compile in parallel, one nvcc per core (one nvcc call takes its files one
    after another, and pytest leaves the other cores idle), then link."""
    nvcc, cutlass = _nvcc(), _cutlass()
    home = Path(nvcc).resolve().parents[1]
    codegen.write_arch_limits()  # the builders' generated header (setup.py writes it too)
    includes = [f"-I{ROOT / 'include'}", f"-I{cutlass / 'include'}", f"-I{cutlass / 'tools' / 'util' / 'include'}",
                f"-I{home / 'include' / 'cccl'}"]
    sources = [str(s) for s in sources]
    if len(sources) == 1:
        steps = [[nvcc, *flags, *includes, sources[0], "-o", str(exe)]]
    else:
        objects = [f"{exe}.{i}.o" for i in range(len(sources))]
        steps = [[nvcc, *flags, *includes, "-c", src, "-o", obj] for src, obj in zip(sources, objects)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(len(steps), os.cpu_count() or 1))) as pool:
        results = list(pool.map(lambda cmd: subprocess.run(cmd, capture_output=True, text=True, timeout=timeout), steps))
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    if len(sources) > 1:
        link = subprocess.run([nvcc, *flags, *objects, "-o", str(exe)], capture_output=True, text=True, timeout=timeout)
        assert link.returncode == 0, link.stderr[-4000:]
    return str(exe)


def test_mx_fragment_and_swizzle_formulas_match_cute(tmp_path):
    exe = build_host_program([ROOT / "tests" / "host" / "mx_fragment_layout.cu"], tmp_path / "mx_fragment_layout")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 6 and all("mismatches: 0" in l for l in lines), run.stdout
    assert all("smem mismatches 0" in l for l in lines if l.startswith("rs ")), run.stdout
