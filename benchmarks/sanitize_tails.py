"""Tail shapes of every built kernel, for compute-sanitizer (benchmarks/gpu_session.sh sanitize).

Runs each built config, forced, on a few shapes whose M, N and K are not tile multiples (tail
CTAs of a cluster, partial K-tiles, unaligned N) with NaN-poisoned outputs, and checks the result
against float64 loosely: the point is memcheck's verdict on out-of-bounds and misaligned
accesses, the numerics are tested by the GPU test suite.

    compute-sanitizer --tool memcheck --error-exitcode 1 python benchmarks/sanitize_tails.py [--family e4m3]
"""

from __future__ import annotations

import argparse

import torch

import persistent_gemm as pg

SHAPES = [(1, 7, 33), (129, 257, 1000), (257, 129, 300), (7, 1000, 129)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", default="", help="only configs whose name contains _<family>_")
    args = ap.parse_args()
    kernels = [k for k in pg._C.built_kernels() if f"_{args.family}_" in k["config"] or not args.family]
    configs = sorted({(k["config"], k["fast_accum"]) for k in kernels})
    pg._C.set_poison_outputs(True)
    bad = 0
    for cfg, fast in configs:
        fp8 = "_e4m3_" in cfg
        for m, n, k in SHAPES:
            if fp8:
                a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
                b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
                sa, sb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
                ref = (a.double() @ b.double()) * sa.double() * sb.double()
                out = pg.scaled_mm(a, b, sa, sb, use_fast_accum=fast, config=cfg)
            elif "_bf16_" in cfg or "_fp16_" in cfg:
                dt = torch.bfloat16 if "_bf16_" in cfg else torch.float16
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
    print(f"{len(configs)} configs, {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
