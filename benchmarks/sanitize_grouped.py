"""The grouped kernels under compute-sanitizer (issue 45): every built grouped config (the decode
GEMVs and the prefill tiles; --match narrows them) forced
through ``pg.grouped_mm`` on routings that reach its edges -- empty experts at both ends, an
expert of one row, experts past one item, a weight N that is not a whole strip, a partial last
K unit, few units (idle workers) and many (strips shared by CTAs: the cross-CTA reduction), and
the masked form -- NaN-poisoned, checked loosely against float64 (the numerics are the GPU
suite's; the point is memcheck's, racecheck's and synccheck's verdicts).

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_grouped.py [--quick] [--match RE]
"""

from __future__ import annotations

import argparse
import re
import sys

import torch

import persistent_gemm as pg
from persistent_gemm.catalogue import E2M1_DTYPES, parse_name

# (counts per expert, N, K)
CASES = [([0, 1, 0, 3], 200, 160), ([9, 0, 17, 1], 257, 1056), ([2, 0, 0, 70], 1000, 4096), ([1], 2880, 2880)]
QUICK = [([0, 1, 0, 3], 200, 160), ([2, 0, 5], 1000, 4096)]
# The tiles: experts of one row, of one whole 128-token tile and past it, a partial weight tile
# and a partial 64-K tile.
TILE_CASES = [([0, 130, 1, 0], 200, 160), ([129, 0, 300], 320, 1056), ([128], 2880, 2880)]
TILE_QUICK = [([0, 130, 1, 0], 200, 160)]


def run(cfg: str, counts, n: int, k: int, masked: bool) -> float:
    family = parse_name(cfg).dtype
    e2m1 = family in E2M1_DTYPES
    e = len(counts)
    quantize, deq = (pg.quantize_mxfp4, pg.dequantize_mxfp4) if e2m1 else (pg.quantize_mxfp8, pg.dequantize_mxfp8)
    wq, ws = quantize(torch.randn(e * n, k, device="cuda"))
    pw = pg.prepare_weight(wq.reshape(e, n, -1), ws.reshape(e, n, -1), fmt="fp4" if e2m1 else "mxfp8")
    w = deq(wq, ws).double().reshape(e, n, k)
    rows = max(counts) if masked else sum(counts)
    x = torch.randn(e * rows if masked else rows, k, device="cuda", dtype=torch.bfloat16)
    xs = None
    if not family.startswith("bf16"):
        x, xs = pg.quantize_mxfp8(x)
    xv = x.double() if xs is None else pg.dequantize_mxfp8(x, xs).double()
    pg._C.set_poison_outputs(True)
    try:
        if masked:
            out = pg.masked_grouped_mm(x.reshape(e, rows, k), pw, torch.tensor(counts, dtype=torch.int32, device="cuda"),
                                       scale_a=None if xs is None else xs.reshape(e, rows, -1), config=cfg)
            ref = torch.stack([xv.reshape(e, rows, k)[i] @ w[i].t() for i in range(e)])
            live = torch.arange(rows, device="cuda")[None, :] < torch.tensor(counts, device="cuda")[:, None]
            out, ref = out[live], ref[live]
        else:
            offs = torch.cumsum(torch.tensor(counts, device="cuda"), 0).to(torch.int32)
            out = pg.grouped_mm(x, pw, offs, scale_a=xs, config=cfg)
            bounds = [0, *torch.tensor(counts).cumsum(0).tolist()]
            ref = torch.cat([xv[bounds[i]:bounds[i + 1]] @ w[i].t() for i in range(e)])
    finally:
        pg._C.set_poison_outputs(False)
    torch.cuda.synchronize()
    return ((out.double() - ref).norm() / ref.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer routings (racecheck, synccheck)")
    ap.add_argument("--match", default="", help="only the grouped configs this regex finds")
    args = ap.parse_args()
    configs = [c["config"] for c in pg._C.built_kernels()
               if "_grouped_" in c["config"] and re.search(args.match, c["config"])]
    configs = list(dict.fromkeys(configs))
    bad = 0
    for cfg in configs:
        gemv = "_gemv_" in cfg
        for counts, n, k in (QUICK if gemv else TILE_QUICK) if args.quick else (CASES if gemv else TILE_CASES):
            for masked in (False, True):
                err = run(cfg, counts, n, k, masked)
                ok = err < 1e-2
                bad += not ok
                print(f"{'ok ' if ok else 'BAD'} {cfg} counts={counts} N={n} K={k} masked={masked} rel err {err:.2e}")
    print(f"{len(configs)} grouped configs, {bad} bad")
    return 1 if bad or not configs else 0


if __name__ == "__main__":
    sys.exit(main())
