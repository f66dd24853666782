"""MXFP8 activation quantization on the GPU, next to the GEMM it feeds (issue 13, item 5).

Per (M, K), in CUDA-graph replay (``persistent_gemm.tuning.replay_times``: inputs rotated past
L2, contenders interleaved, medians), bf16 activations in:

    kernel      pg.quantize_mxfp8 (the extension's CUDA kernel)
    compiled    torch.compile(quantize_mxfp8_reference) (inductor's fused kernels)
    eager       quantize_mxfp8_reference (the torch-ops definition, ~15 kernels)
    gemm        pg.mxfp8_mm of those activations against an (N = K) prepared weight

plus the eager host time per call of ``kernel`` and ``eager`` (perf_counter over back-to-back
calls: what a non-graph caller pays). The kernel's share of quantize + GEMM is the number that
matters at decode. Results to ``--out``.csv.

    python benchmarks/bench_quant.py --out benchmarks/results/h200_quant
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch

import persistent_gemm as pg
from persistent_gemm.quant import quantize_mxfp8_reference
from persistent_gemm.tuning import replay_times

from bench_decode import host_us  # the same eager host-time measure as the decode table
from bench_mm import write_csv

TOKENS = [1, 16, 128, 2048, 8192]
KS = [4096, 8192]
COPIES = 8


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/h200_quant")
    p.add_argument("--tokens", type=int, nargs="*", default=TOKENS)
    p.add_argument("--k", type=int, nargs="*", default=KS)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--inner", type=int, default=20)
    args = p.parse_args()
    compiled = torch.compile(quantize_mxfp8_reference, dynamic=False)
    rows = []
    print(f"{'M':>6} {'K':>6} | {'kernel':>8} {'compiled':>8} {'eager':>8} {'gemm':>8} us | "
          f"{'share':>6} | host us kernel/eager")
    for k in args.k:
        w = torch.randn(k, k, device="cuda").bfloat16()
        wq, ws = pg.quantize_mxfp8(w)
        weight = pg.prepare_weight(wq, ws, fmt="mxfp8")
        for m in args.tokens:
            xs = [torch.randn(m, k, device="cuda").bfloat16() for _ in range(COPIES)]
            qs = [pg.quantize_mxfp8(x) for x in xs]
            for x in xs:  # compile once per shape, outside the timing
                compiled(x)
            calls = [
                [lambda x=x: pg.quantize_mxfp8(x) for x in xs],
                [lambda x=x: compiled(x) for x in xs],
                [lambda x=x: quantize_mxfp8_reference(x) for x in xs],
                [lambda q=q: pg.mxfp8_mm(q[0], weight, q[1]) for q in qs],
            ]
            times = replay_times(calls, args.reps, args.inner)
            kern, comp, eager, gemm = (statistics.median(t) for t in times)
            host_k = host_us(pg.quantize_mxfp8, (xs[0],))
            host_e = host_us(quantize_mxfp8_reference, (xs[0],))
            share = kern / (kern + gemm)
            gbs = (m * k * 2 + m * k + m * (k // 32)) / (kern * 1e-6) / 1e9
            rows.append(dict(m=m, k=k, kernel_us=kern, compiled_us=comp, eager_us=eager, gemm_us=gemm,
                             kernel_share=share, kernel_gbs=gbs, host_kernel_us=host_k, host_eager_us=host_e,
                             gpu=torch.cuda.get_device_name()))
            print(f"{m:>6} {k:>6} | {kern:8.2f} {comp:8.2f} {eager:8.2f} {gemm:8.2f}    | {share:6.1%} | "
                  f"{host_k:.1f} / {host_e:.1f}   ({gbs:.0f} GB/s)")
    out = Path(args.out + ".csv")
    write_csv(out, rows)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
