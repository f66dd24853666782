"""The bf16-placed layout of packed e2m1 weights (layout/e2m1_placed.hpp; issue 46, step 1 of
docs/design/fp4_placed_layout.md): a bit permutation of each word of eight codes, placed and
unplaced back, each pair decoded by 11 integer operations to the exact e2m1 values times 2^-126,
checked exhaustively per 16-bit half by a host program (tests/host/e2m1_placed.cu)."""

from __future__ import annotations

import subprocess

from support.host_build import ROOT, build_host_program


def test_placed_pairs_are_the_exact_codes_of_every_half(tmp_path):
    exe = build_host_program([ROOT / "tests" / "host" / "e2m1_placed.cu"], tmp_path / "e2m1_placed", timeout=600)
    run = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "524288 pair decodes checked, 0 mismatches" in run.stdout, run.stdout + run.stderr
