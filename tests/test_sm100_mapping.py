"""The SM100 kernels' arch-neutral pieces (include/persistent_gemm/kernel/sm100_tile_mapping.hpp):
2-SM CTA roles, live MMA tiles at the edges, workers and waves, the MX problem rules, and the
blocked scale-factor addressing. tests/device/sm100_mapping_probe.cu evaluates the very functions
the kernels call, on the host (here, on any machine with nvcc) and on the device (the H200),
and checks the addressing against CUTLASS's own Sm1xxBlockScaledConfig layouts and the relayout
kernel. Each record is compared with a Python reference written from the definitions."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest
import torch

from persistent_gemm import TileSchedule
from persistent_gemm.archs import ARCHS
from persistent_gemm.scale_layout import to_blocked
from persistent_gemm.schedule import default_workers
from support.host_build import HOST_FLAGS, ROOT, build_host_program


@pytest.fixture(scope="module")
def probe(tmp_path_factory) -> Path:
    exe = tmp_path_factory.mktemp("probe") / "sm100_mapping_probe"
    # sm_90a device code: the --device run on the H200; the host records need no GPU.
    return Path(build_host_program([ROOT / "tests" / "device" / "sm100_mapping_probe.cu"], exe,
                                   flags=(*HOST_FLAGS, ARCHS["sm90a"].gencode)))


def _run(exe: Path, *args: str):
    run = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=300)
    records = {"H": [], "D": []}
    summary = []
    for line in run.stdout.splitlines():
        if line[:2] in ("H ", "D "):
            head, tail = line[2:].split(" : ")
            records[line[0]].append((tuple(map(int, head.split())), tuple(map(int, tail.split()))))
        else:
            summary.append(line)
    return run.returncode, records, summary


# -- Python references, from the definitions ---------------------------------------------------
def _role(ctas, cta_m, rank, m):
    pair = [rank // ctas * ctas + i for i in range(ctas)]  # CTAs {2j, 2j+1} share one MMA
    return (int(rank == pair[0]), next(p for p in pair if p != rank) if ctas == 2 else rank,
            (m // ctas) * 1000 + m % ctas, m * cta_m)


def _live(ctas, tiles_m, m, n, tiles_n):
    members = range(m // ctas * ctas, m // ctas * ctas + ctas)  # the CTA tiles of this MMA tile
    return int(any(t < tiles_m for t in members) and n < tiles_n)


def _workers(sm, cs, mac, mw):
    if mw > 0:
        return mw
    w = default_workers(sm, TileSchedule(cluster=(cs, 1) if cs <= 4 else (4, cs // 4))) if sm >= cs else 1
    return max(1, min(w, mac) if mac > 0 else w)


def _rejection(e2m1, k, ldd, pad_writable, n=7, chunk=8, ldb=None):
    """sm100_mx::Reject for the probe's problems (M = 33, N = 7, bf16 D): 0 none, 2 K alignment,
    4 output rows (a TMA store writes whole 16-byte chunks), 5 an e2m1 weight row stride that is
    not a 32-byte multiple (TMA 16U4_ALIGN16B)."""
    if k % (128 if e2m1 else 16):
        return 2
    if e2m1 and ldb is not None and ldb % 32:
        return 5
    if ldd < n or ldd % chunk or (n % chunk and not (pad_writable and ldd >= -(-n // chunk) * chunk)):
        return 4
    return 0


def _sf_positions(blocks: int, rows: int = 300) -> dict:
    """{row * blocks + block: byte} of the blocked layout, from scale_layout.to_blocked itself: a
    tensor of unique indices is carried through it one byte plane at a time (it moves uint8
    codes; padding bytes come out as 127 in every plane, above any index here)."""
    ids = torch.arange(rows * blocks, dtype=torch.int64).reshape(rows, blocks)
    value = torch.zeros((), dtype=torch.int64)
    for plane in range(3):
        codes = ((ids >> (8 * plane)) & 0xFF).to(torch.uint8).view(torch.float8_e8m0fnu)
        value = value + (to_blocked(codes).view(torch.uint8).reshape(-1).to(torch.int64) << (8 * plane))
    return {int(v): byte for byte, v in enumerate(value.tolist()) if v < rows * blocks}


def _check_records(recs):
    sf_lut = {}
    seen = set()
    for args, res in recs:
        fn = args[0]
        seen.add(fn)
        if fn == 0:
            ctas, cta_m, rank, m = args[1:5]
            assert res == _role(ctas, cta_m, rank, m), (args, res)
        elif fn == 1:
            ctas, tm, m, n, tn = args[1:6]
            assert res[0] == _live(ctas, tm, m, n, tn), (args, res)
        elif fn == 2:
            sm, cs, mac, mw = args[1:5]
            w = _workers(sm, cs, mac, mw)
            assert res[:3] == (w, math.ceil(1000 / w), math.ceil(2**30 / w)), (args, res)
        elif fn == 3:
            e2m1, k, ldd = args[1:4]
            assert res[0] == _rejection(e2m1, k, ldd, False), (args, res)
            assert res[1] == _rejection(e2m1, k, ldd, True), (args, res)
            align = 128 if e2m1 else 16
            assert res[2] == math.ceil(k / align) * align, (args, res)
        elif fn == 5:
            e2m1, k, ldd = args[1:4]
            lda = -(-k // 16) * 16
            ldb = (-(-(k // 2) // 16) * 16 if e2m1 else lda) + 16
            assert res[0] == _rejection(e2m1, k, ldd, True, ldb=ldb), (args, res)
        elif fn == 4:
            blocks, row, b = args[1:4]
            if blocks not in sf_lut:
                sf_lut[blocks] = _sf_positions(blocks)
            byte, r, b0, tile_atom = res
            assert byte == sf_lut[blocks][row * blocks + b], (args, res)
            assert (r, b0) == (row, b // 4 * 4), (args, res)  # the word's origin
            assert tile_atom == byte // 512, (args, res)  # the atom a CTA's stage copies
    assert seen == {0, 1, 2, 3, 4, 5}


def test_sm100_mapping_host_matches_references_and_cutlass(probe):
    rc, recs, summary = _run(probe)
    assert rc == 0, summary
    assert "cutlass layout checked" in "\n".join(summary) and "mismatches 0" in "\n".join(summary), summary
    assert len(recs["H"]) > 1000
    _check_records(recs["H"])


@pytest.mark.sm90
def test_sm100_mapping_device_matches_host_and_relayout(probe):
    """On the H200: the same functions compiled for the device give the host's answers, and the
    relayout kernel puts every plain scale byte where sf_byte says (a bijection, padding 2^0)."""
    rc, recs, summary = _run(probe, "--device")
    assert rc == 0, summary
    assert recs["D"] == recs["H"], "device and host disagree"
    assert "relayout mismatches 0" in summary, summary
