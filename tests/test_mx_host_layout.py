"""The SM90 MX mainloop indexes its accumulator fragment, its register A fragment and the 64 B
swizzled packed-e2m1 tile by hand (collective/sm90_mx_block_scaled_mma.hpp). Those formulas are
checked here against CuTe's own layouts, on the host: tests/host/mx_fragment_layout.cu is
compiled by nvcc (host code only, no GPU) and run."""

import subprocess

from support.host_build import ROOT, build_host_program  # test_fold, test_gemv import them from here too


def test_mx_fragment_and_swizzle_formulas_match_cute(tmp_path):
    exe = build_host_program([ROOT / "tests" / "host" / "mx_fragment_layout.cu"], tmp_path / "mx_fragment_layout")
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 6 and all("mismatches: 0" in l for l in lines), run.stdout
    assert all("smem mismatches 0" in l for l in lines if l.startswith("rs ")), run.stdout
