"""Tail shapes of every built kernel, for compute-sanitizer (benchmarks/gpu_session.sh sanitize).

Runs each built config, forced, on a few shapes whose M, N and K are not tile multiples (tail
CTAs of a cluster, partial K-tiles, unaligned N) with NaN-poisoned outputs, and checks the result
against float64 loosely: the point is memcheck's verdict on out-of-bounds and misaligned
accesses, the numerics are tested by the GPU test suite. The MX configs (mxfp8, e4m3xe2m1) run
on MX_SHAPES (K a multiple of the 32-element scale block, as fp8_fp4_mm requires, but not of a
K-tile; mxfp8 also gets a partial last block), with plain operands and, where
``pg.prepare_weight`` exists, a prepared weight; a shape the op refuses (ValueError) is
reported as "skip", not counted as bad.

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_tails.py [--family e4m3] [--match REGEX]
"""

from __future__ import annotations

import argparse
import re

import torch

import persistent_gemm as pg
from persistent_gemm.catalogue import E2M1_DTYPES, MX_DTYPES, WEIGHT_ONLY_DTYPES, parse_name

SHAPES = [(1, 7, 33), (129, 257, 1000), (257, 129, 300), (7, 1000, 129)]
MX_SHAPES = [(1, 7, 32), (129, 257, 1056), (257, 129, 320), (7, 1000, 160)]
MX_PARTIAL_K = [(129, 257, 1000)]  # mxfp8 only: the last scale block covers 8 elements
# The MX decode GEMVs (``_gemv_``): M up to the config's tokens (-1 there), a strip tail, a partial
# last 256-byte unit, and N = 8191 / K = 8192, where strips are shared by CTAs (the cross-CTA
# reduction: racecheck/synccheck matter there).
GEMV_SHAPES = [(1, 7, 32), (-1, 257, 1056), (-1, 8191, 8192), (2, 1000, 28672)]
# --quick (racecheck / synccheck, whose instrumentation is slow): a tail strip and a 16-CTA strip.
GEMV_QUICK = [(1, 7, 32), (-1, 1000, 4096)]


def mx_cases(cfg: str, m: int, n: int, k: int):
    """(label, call, float64 reference) for one MX config and shape: plain and prepared."""
    dtype = parse_name(cfg).dtype
    fp4 = dtype in E2M1_DTYPES
    op, fmt = (pg.fp8_fp4_mm, "fp4") if fp4 else (pg.mxfp8_mm, "mxfp8")
    wq, ws = (pg.quantize_mxfp4 if fp4 else pg.quantize_mxfp8)(torch.randn(n, k, device="cuda"))
    wd = (pg.dequantize_mxfp4 if fp4 else pg.dequantize_mxfp8)(wq, ws)
    if dtype in WEIGHT_ONLY_DTYPES:  # weight-only: bf16 activations as they are, a prepared weight
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        yield "weight-only", lambda: pg.mm(x, pg.prepare_weight(wq, ws, fmt=fmt), config=cfg), x.double() @ wd.double().t()
        return
    xq, xs = pg.quantize_mxfp8(torch.randn(m, k, device="cuda"))
    ref = pg.dequantize_mxfp8(xq, xs).double() @ wd.double().t()
    yield "plain", lambda: op(xq, wq.t(), xs, ws, config=cfg), ref
    if hasattr(pg, "prepare_weight"):  # prepared inside the call: its refusals are skips too
        yield "prepared", lambda: op(xq, pg.prepare_weight(wq, ws, fmt=fmt), xs, config=cfg), ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="", help="only configs whose name contains _<family>_")
    ap.add_argument("--match", default="", help="only configs whose name this regex finds (re.search)")
    ap.add_argument("--quick", action="store_true", help="decode GEMVs: two shapes only (racecheck, synccheck)")
    args = ap.parse_args()
    kernels = [k for k in pg._C.built_kernels() if (f"_{args.family}_" in k["config"] + "_" or not args.family)
               and re.search(args.match, k["config"])]
    configs = sorted({(k["config"], bool(k.get("fast_accum", False))) for k in kernels})
    pg._C.set_poison_outputs(True)
    bad = skipped = 0
    for cfg, fast in configs:
        spec = parse_name(cfg)
        if spec.dtype in MX_DTYPES + WEIGHT_ONLY_DTYPES:
            shapes = MX_SHAPES + (MX_PARTIAL_K if spec.dtype == "mxfp8" else [])
            if spec.kernel == "gemv":
                tokens = spec.tile[1]
                shapes = [(tokens if m < 0 else m, n, k) for m, n, k in (GEMV_QUICK if args.quick else GEMV_SHAPES)]
            for m, n, k in shapes:
                for label, call, ref in mx_cases(cfg, m, n, k):
                    try:
                        out = call()
                    except ValueError as e:  # a rule of the op (K block, alignment), not a memory error
                        skipped += 1
                        print(f"skip {cfg} {label} {m}x{n}x{k}: {str(e).splitlines()[0]}", flush=True)
                        continue
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    ok = bool(torch.isfinite(out).all()) and err < 1e-2
                    bad += not ok
                    print(f"{'ok ' if ok else 'BAD'} {cfg} {label} {m}x{n}x{k} rel_err={err:.2e}", flush=True)
            continue
        fp8 = spec.dtype == "e4m3"
        for m, n, k in SHAPES:
            if fp8:
                a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
                sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
                ref = (a.double() @ b.double()) * sa.double() * sb.double()
                out = pg.scaled_mm(a, b, sa, sb, use_fast_accum=fast, config=cfg)
            elif spec.dtype in ("bf16", "fp16"):
                dt = torch.bfloat16 if spec.dtype == "bf16" else torch.float16
                a = torch.randn(m, k, device="cuda", dtype=dt)
                b = torch.randn(n, k, device="cuda", dtype=dt).t()
                ref = a.double() @ b.double()
                out = pg.mm(a, b, config=cfg)
            else:
                continue
            err = ((out.double() - ref).norm() / ref.norm()).item()
            ok = bool(torch.isfinite(out).all()) and err < 1e-2
            bad += not ok
            print(f"{'ok ' if ok else 'BAD'} {cfg} {m}x{n}x{k} rel_err={err:.2e}", flush=True)
    torch.cuda.synchronize()
    print(f"{len(configs)} configs, {bad} bad, {skipped} refused shapes skipped")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
